"""The engine: every operation as conditional Delta commits (enqueue, delivery, sessions, catalog,
retention, runtime counts, fan-out), under the public API modules and over sparkbus.core and
sparkbus.storage."""
