"""Pure rules, without I/O: partitioning, sequencing, tiers, names, entity options, lock transitions,
message encoding and sizes, the rule model and the SQL rule language. Nothing here reads or writes a table."""
