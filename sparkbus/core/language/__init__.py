"""The Service Bus rule language: SQL filters and actions parsed into typed trees (syntax), evaluated a
batch at a time over Arrow columns (vectors, evaluate), and subscription rules compiled from them
(compiled). Pure: no I/O, no Spark."""
from .compiled import (CompiledRule, Copies, check_action_text, check_filter_text, compile_correlation, compile_sql,
                       select)
from .evaluate import MessageView, condition, evaluate, run_action, take_rows
from .syntax import parse_action, parse_filter

__all__ = ["CompiledRule", "Copies", "MessageView", "check_action_text", "check_filter_text", "compile_correlation",
           "compile_sql", "condition", "evaluate", "parse_action", "parse_filter", "run_action", "select", "take_rows"]
