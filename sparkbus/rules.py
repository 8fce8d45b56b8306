"""Subscription rule filters and actions, as azure-servicebus names them (the model lives in
sparkbus.core.filters, with its validation and stored form)."""
from __future__ import annotations

from .core.filters import (CorrelationRuleFilter, FalseRuleFilter, RuleProperties, SqlRuleAction, SqlRuleFilter,
                           TrueRuleFilter)

__all__ = ["SqlRuleFilter", "TrueRuleFilter", "FalseRuleFilter", "CorrelationRuleFilter", "SqlRuleAction",
           "RuleProperties"]
