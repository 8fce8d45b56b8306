"""The Service Bus SQL filter and action language: tokens, a recursive-descent parser and the typed tree.

Pure: no I/O, no Spark. User text is only ever turned into the dataclasses below; it never reaches
Spark's SQL parser or Python's eval. Every syntax error is a ValueError naming the position (0-based
character offset) and what was expected there.

Grammar (Service Bus "SQL filter syntax" and "SQL rule action syntax"):
    predicate  := or
    or         := and (OR and)*
    and        := not (AND not)*
    not        := NOT not | test
    test       := EXISTS '(' property ')'
                | sum [ cmp sum | IS [NOT] NULL | [NOT] IN '(' sum (',' sum)* ')'
                      | [NOT] LIKE string [ESCAPE string] ]
    sum        := product (('+' | '-') product)*
    product    := unary (('*' | '/' | '%') unary)*
    unary      := ('+' | '-') unary | primary
    primary    := constant | @parameter | function '(' args ')' | property | '(' predicate ')'
    property   := [(sys | user) '.'] name        name: regular, [delimited] or "quoted" identifier
    action     := statement ((',' | ';') statement)* [';']
    statement  := SET property '=' sum | REMOVE property
A 'SET a = 1, b = 2' continues the SET after a comma.

Limits (each a ValueError with the position): text of valid Unicode (no lone surrogate, which no message
could carry or compare); trees at most MAX_DEPTH levels deep, and as deep in parentheses, NOT, signs and
function calls, so neither this parser nor the tree walkers that evaluate a rule exhaust Python's stack.
AND and OR chains are built as balanced trees (both are associative in three-valued logic, and every
operand is evaluated either way), so a long list of ORed conditions stays shallow; arithmetic chains
keep their left-to-right shape. An action may set a system property that is an id (sys.MessageId,
sys.ReplyToSessionId) to a string constant of 1 to MAX_ID_LENGTH characters only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Optional, TypeVar, Union

from ..wire import MAX_DEPTH, MAX_ID_LENGTH, lone_surrogate

T = TypeVar("T")
MAX_TEXT_LENGTH = 1024
MAX_ACTION_STATEMENTS = 32

# System properties readable in filters and actions, by lower-case name -> canonical name.
SYSTEM_PROPERTIES = {name.lower(): name for name in (
    "MessageId", "CorrelationId", "To", "ReplyTo", "Label", "Subject", "SessionId", "ReplyToSessionId",
    "ContentType", "SequenceNumber", "EnqueuedTimeUtc", "ScheduledEnqueueTimeUtc", "TimeToLive",
    "DeliveryCount", "Size", "PartitionKey")}
# System properties an action may SET or REMOVE (the others identify, place or describe the stored message).
SETTABLE_SYSTEM_PROPERTIES = {"CorrelationId", "To", "ReplyTo", "Label", "Subject", "ReplyToSessionId", "ContentType",
                              "MessageId"}
# System properties that are ids: 1 to MAX_ID_LENGTH characters.
ID_PROPERTIES = {"MessageId", "SessionId", "PartitionKey", "ReplyToSessionId"}
KEYWORDS = {"and", "or", "not", "is", "null", "in", "like", "escape", "exists", "true", "false", "set", "remove"}
FUNCTIONS = {"newid": 0, "property": 1, "p": 1}


# ---- the tree ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Constant:
    value: Union[None, bool, int, float, str]


@dataclass(frozen=True)
class Parameter:
    name: str  # with its '@', as stored in the rule's parameters


@dataclass(frozen=True)
class Property:
    scope: str  # "sys" or "user"
    name: str   # canonical name for sys, as written for user (matched case-insensitively)


@dataclass(frozen=True)
class Call:
    function: str  # "newid" or "property"
    args: tuple["Node", ...]


@dataclass(frozen=True)
class Unary:
    op: str  # "-", "+" or "not"
    operand: "Node"


@dataclass(frozen=True)
class Binary:
    op: str  # + - * / % = <> > >= < <= and or
    left: "Node"
    right: "Node"


@dataclass(frozen=True)
class IsNull:
    operand: "Node"
    negated: bool


@dataclass(frozen=True)
class In:
    operand: "Node"
    values: tuple["Node", ...]
    negated: bool


@dataclass(frozen=True)
class Like:
    operand: "Node"
    pattern: str
    escape: Optional[str]
    negated: bool


@dataclass(frozen=True)
class Exists:
    property: Property


Node = Union[Constant, Parameter, Property, Call, Unary, Binary, IsNull, In, Like, Exists]


@dataclass(frozen=True)
class SetStatement:
    target: Property
    value: Node


@dataclass(frozen=True)
class RemoveStatement:
    target: Property


Statement = Union[SetStatement, RemoveStatement]

# ---- tokens ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Token:
    kind: str   # "number", "string", "ident", "keyword", "param", "op", "end"
    text: str   # identifier name, keyword (lower case), operator, or the literal's source text
    pos: int
    value: Union[int, float, str, None] = None

    def describe(self) -> str:
        return "end of text" if self.kind == "end" else repr(self.text)

    @property
    def string(self) -> str:
        """A string token's value (its text without the quotes)."""
        assert isinstance(self.value, str), self
        return self.value


_DIGITS = "0123456789"  # str.isdigit() also accepts characters such as '²' that are not numbers here
_NUMBER = re.compile(r"(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")
_REGULAR = re.compile(r"[^\W\d][\w$]*")  # a letter (any script) or _, then letters, digits, _ and $ (the
# first character is also checked with str.isalpha: \w takes signs such as '²' that are no letters)
_OPERATORS = ("<>", "!=", ">=", "<=", "=", ">", "<", "+", "-", "*", "/", "%", "(", ")", ",", ".", ";")


def _error(text: str, pos: int, message: str) -> ValueError:
    near = text[pos:pos + 20]
    return ValueError(f"syntax error at position {pos}: {message}" + (f" (near {near!r})" if near else ""))


def _closing(text: str, start: int, close: str, what: str) -> tuple[str, int]:
    """Body of a literal or identifier opened at `start`, where a doubled `close` stands for itself."""
    out, i = [], start + 1
    while i < len(text):
        if text[i] == close:
            if i + 1 < len(text) and text[i + 1] == close:
                out.append(close)
                i += 2
                continue
            return "".join(out), i + 1
        out.append(text[i])
        i += 1
    raise _error(text, start, f"unterminated {what}: expected a closing {close}")


def tokenize(text: str) -> list[Token]:
    tokens, i = [], 0
    while i < len(text):
        c = text[i]
        if c.isspace():
            i += 1
            continue
        if c in _DIGITS or (c == "." and i + 1 < len(text) and text[i + 1] in _DIGITS):
            m = _NUMBER.match(text, i)
            assert m is not None  # a digit, or a dot before one, starts a number
            literal = m.group(0)
            value: Union[int, float, str]
            if m.group(2) or "." in literal:
                value = float(literal)
            else:
                value = int(literal)
                if value > 2 ** 63 - 1:
                    raise _error(text, i, f"integer {literal} does not fit in 64 bits")
            if m.end() < len(text) and (text[m.end()].isalnum() or text[m.end()] == "_"):
                raise _error(text, m.end(), f"unexpected {text[m.end()]!r} after the number {literal}")
            tokens.append(Token("number", literal, i, value))
            i = m.end()
        elif c == "'":
            value, end = _closing(text, i, "'", "string")
            tokens.append(Token("string", text[i:end], i, value))
            i = end
        elif c in "[\"":
            value, end = _closing(text, i, "]" if c == "[" else '"', "identifier")
            if not value:
                raise _error(text, i, "empty identifier")
            tokens.append(Token("ident", value, i, "delimited"))
            i = end
        elif c == "@":
            m = _REGULAR.match(text, i + 1)
            if not m:
                raise _error(text, i, "expected a parameter name after '@'")
            tokens.append(Token("param", "@" + m.group(0), i))
            i = m.end()
        elif (c.isalpha() or c == "_") and (word_match := _REGULAR.match(text, i)) is not None:
            word = word_match.group(0)
            if word.lower() in KEYWORDS:
                tokens.append(Token("keyword", word.lower(), i))
            else:
                tokens.append(Token("ident", word, i, "regular"))
            i = word_match.end()
        else:
            op = next((o for o in _OPERATORS if text.startswith(o, i)), None)
            if op is None:
                raise _error(text, i, f"unexpected character {c!r}")
            tokens.append(Token("op", op, i))
            i += len(op)
    tokens.append(Token("end", "", len(text)))
    return tokens


# ---- parser -----------------------------------------------------------------------------------------------

def _pairwise(items: list[T], combine: Callable[[T, T], T]) -> T:
    """items combined neighbour with neighbour, round after round, in order: a balanced reduction."""
    while len(items) > 1:
        items = [combine(items[i], items[i + 1]) if i + 1 < len(items) else items[i] for i in range(0, len(items), 2)]
    return items[0]


def balanced(op: str, nodes: list[Node]) -> Node:
    """nodes joined by "and" or "or", in order, as a balanced tree: its depth grows with the log of their
    count, so a long chain never nests deep (both operators are associative in three-valued logic)."""
    return _pairwise(nodes, lambda left, right: Binary(op, left, right))


_COMPARISONS = {"=", "<>", "!=", ">", ">=", "<", "<="}


class _Parser:
    def __init__(self, text: str) -> None:
        if not isinstance(text, str):
            raise TypeError(f"a rule expression must be a str, got {type(text).__name__}")
        if not text.strip():
            raise ValueError("a rule expression must not be empty")
        if len(text) > MAX_TEXT_LENGTH:
            raise ValueError(f"a rule expression is at most {MAX_TEXT_LENGTH} characters, got {len(text)}")
        surrogate = lone_surrogate(text)
        if surrogate >= 0:
            raise _error(text, surrogate, f"lone surrogate {text[surrogate]!r}: a rule's text must be valid Unicode "
                         "(encodable as UTF-8)")
        self.text = text
        self.tokens = tokenize(text)
        self.i = 0
        self.nesting = 0  # parentheses, NOT, signs and function calls around the current token
        self.depth = 0    # tree depth of the node the last parse method returned

    def nest(self, token: Token) -> None:
        """One construct deeper; ValueError past MAX_DEPTH (each costs this parser stack frames)."""
        self.nesting += 1
        if self.nesting > MAX_DEPTH:
            raise _error(self.text, token.pos, f"the expression is nested deeper than {MAX_DEPTH} levels of "
                         "parentheses, NOT, signs and function calls")

    def deeper(self, depth: int, token: Token) -> int:
        """depth, the tree depth of a node built at token; ValueError past MAX_DEPTH."""
        if depth > MAX_DEPTH:
            raise _error(self.text, token.pos, f"the expression is nested deeper than {MAX_DEPTH} levels of "
                         "operators")
        self.depth = depth
        return depth

    def joined(self, op: str, terms: list[tuple[Node, int]], token: Token) -> Node:
        """(node, depth) terms joined by AND or OR as a balanced tree (see balanced)."""
        self.deeper(_pairwise([depth for _, depth in terms], lambda a, b: max(a, b) + 1), token)
        return balanced(op, [node for node, _ in terms])

    @property
    def token(self) -> Token:
        return self.tokens[self.i]

    def fail(self, expected: str, token: Optional[Token] = None) -> ValueError:
        token = token or self.token
        return _error(self.text, token.pos, f"expected {expected}, found {token.describe()}")

    def take(self, kind: str, text: Optional[str] = None) -> Optional[Token]:
        t = self.token
        if t.kind == kind and (text is None or t.text == text):
            self.i += 1
            return t
        return None

    def expect(self, kind: str, text: str, expected: str) -> Token:
        t = self.take(kind, text)
        if t is None:
            raise self.fail(expected)
        return t

    def end(self) -> None:
        if self.token.kind != "end":
            raise self.fail("an operator or the end of the expression")

    # predicates
    def predicate(self) -> Node:
        start = self.token
        terms = [(self.conjunction(), self.depth)]
        while self.take("keyword", "or"):
            terms.append((self.conjunction(), self.depth))
        return self.joined("or", terms, start)

    def conjunction(self) -> Node:
        start = self.token
        terms = [(self.negation(), self.depth)]
        while self.take("keyword", "and"):
            terms.append((self.negation(), self.depth))
        return self.joined("and", terms, start)

    def negation(self) -> Node:
        t = self.token
        if self.take("keyword", "not"):
            self.nest(t)
            node = Unary("not", self.negation())
            self.nesting -= 1
            self.deeper(self.depth + 1, t)
            return node
        return self.test()

    def test(self) -> Node:
        start = self.token
        if self.take("keyword", "exists"):
            self.expect("op", "(", "'(' after EXISTS")
            prop = self.property_reference("a property name inside EXISTS( )")
            self.expect("op", ")", "')' closing EXISTS(")
            self.deeper(2, start)
            return Exists(prop)
        left = self.sum()
        depth = self.depth
        t = self.token
        if t.kind == "op" and t.text in _COMPARISONS:
            self.i += 1
            op = "<>" if t.text == "!=" else t.text
            right = self.sum()
            self.deeper(max(depth, self.depth) + 1, t)
            return Binary(op, left, right)
        if self.take("keyword", "is"):
            negated = bool(self.take("keyword", "not"))
            self.expect("keyword", "null", "NULL after IS [NOT]")
            self.deeper(depth + 1, t)
            return IsNull(left, negated)
        negated = bool(self.take("keyword", "not"))
        if self.take("keyword", "in"):
            self.expect("op", "(", "'(' after IN")
            values = [self.sum()]
            depth = max(depth, self.depth)
            while self.take("op", ","):
                values.append(self.sum())
                depth = max(depth, self.depth)
            self.expect("op", ")", "',' or ')' in the IN list")
            self.deeper(depth + 1, t)
            return In(left, tuple(values), negated)
        if self.take("keyword", "like"):
            pattern = self.take("string")
            if pattern is None:
                raise self.fail("a 'pattern' string after LIKE")
            escape = None
            if self.take("keyword", "escape"):
                e = self.take("string")
                if e is None or len(e.string) != 1:
                    raise self.fail("a one-character 'c' string after ESCAPE", e)
                escape = e.string
            self.deeper(depth + 1, t)
            return Like(left, pattern.string, escape, negated)
        if negated:
            raise self.fail("IN or LIKE after NOT")
        self.depth = depth
        return left

    # expressions
    def sum(self) -> Node:
        node = self.product()
        depth = self.depth
        while self.token.kind == "op" and self.token.text in "+-":
            t = self.token
            self.i += 1
            node = Binary(t.text, node, self.product())
            depth = self.deeper(max(depth, self.depth) + 1, t)
        self.depth = depth
        return node

    def product(self) -> Node:
        node = self.unary()
        depth = self.depth
        while self.token.kind == "op" and self.token.text in ("*", "/", "%"):
            t = self.token
            self.i += 1
            node = Binary(t.text, node, self.unary())
            depth = self.deeper(max(depth, self.depth) + 1, t)
        self.depth = depth
        return node

    def unary(self) -> Node:
        t = self.token
        if t.kind == "op" and t.text in "+-":
            self.i += 1
            self.nest(t)
            operand = self.unary()
            self.nesting -= 1
            if t.text == "-" and isinstance(operand, Constant) and isinstance(operand.value, (int, float)) \
                    and not isinstance(operand.value, bool):
                self.depth = 1
                return Constant(-operand.value)
            self.deeper(self.depth + 1, t)
            return Unary(t.text, operand)
        return self.primary()

    def primary(self) -> Node:
        t = self.token
        self.depth = 1
        if t.kind == "number" or t.kind == "string":
            self.i += 1
            return Constant(t.value)
        if t.kind == "keyword" and t.text in ("true", "false", "null"):
            self.i += 1
            return Constant({"true": True, "false": False, "null": None}[t.text])
        if t.kind == "param":
            self.i += 1
            return Parameter(t.text)
        if self.take("op", "("):
            self.nest(t)
            node = self.predicate()
            self.nesting -= 1
            self.expect("op", ")", "')'")
            return node
        if t.kind == "ident" and t.value == "regular" and t.text.lower() in FUNCTIONS \
                and self.tokens[self.i + 1].kind == "op" and self.tokens[self.i + 1].text == "(":
            return self.call()
        if t.kind == "ident":
            return self.property_reference("a property")
        raise self.fail("a constant, property, parameter, function or '('")

    def call(self) -> Node:
        start = self.token
        name = start.text.lower()
        self.i += 2
        self.nest(start)
        args, depth = [], 0
        if not self.take("op", ")"):
            args.append(self.sum())
            depth = self.depth
            while self.take("op", ","):
                args.append(self.sum())
                depth = max(depth, self.depth)
            self.expect("op", ")", "',' or ')' closing the function's arguments")
        self.nesting -= 1
        if len(args) != FUNCTIONS[name]:
            raise _error(self.text, self.tokens[self.i - 1].pos,
                         f"{name}() takes {FUNCTIONS[name]} argument(s), got {len(args)}")
        self.deeper(depth + 1, start)
        return Call("property" if name == "p" else name, tuple(args))

    def property_reference(self, expected: str) -> Property:
        first = self.token
        if first.kind != "ident":
            raise self.fail(expected)
        self.i += 1
        scope, name_token = "user", first
        if self.take("op", "."):
            name_token = self.token
            if name_token.kind != "ident":
                raise self.fail("a property name after '.'")
            self.i += 1
            scope = first.text.lower()
            if first.value != "regular" or scope not in ("sys", "user"):
                raise _error(self.text, first.pos, f"unknown property scope {first.text!r}; scopes are sys and user")
        if scope == "sys":
            canonical = SYSTEM_PROPERTIES.get(name_token.text.lower())
            if canonical is None:
                raise _error(self.text, name_token.pos, f"unknown system property {name_token.text!r}; system "
                             f"properties are {', '.join(sorted(set(SYSTEM_PROPERTIES.values())))}")
            self.depth = 1
            return Property("sys", canonical)
        self.depth = 1
        return Property("user", name_token.text)


def parse_filter(text: str) -> Node:
    """The tree of a SQL filter expression; ValueError with the position on a syntax error."""
    parser = _Parser(text)
    node = parser.predicate()
    parser.end()
    if isinstance(node, Constant) and not isinstance(node.value, bool) and node.value is not None:
        raise _error(text, 0, "expected a condition (a comparison, IS NULL, IN, LIKE, EXISTS or TRUE/FALSE), "
                     f"found the constant {node.value!r}")
    if isinstance(node, Binary) and node.op in "+-*/%":
        raise _error(text, 0, "expected a condition (a comparison, IS NULL, IN, LIKE, EXISTS or TRUE/FALSE), "
                     "found an arithmetic expression")
    return node


def parse_action(text: str) -> tuple[Statement, ...]:
    """The statements of a SQL rule action; ValueError with the position on a syntax error."""
    parser = _Parser(text)
    statements: list[Statement] = []
    continuing_set = False
    while True:
        if parser.take("keyword", "set"):
            statements.append(_assignment(parser))
            continuing_set = True
        elif parser.take("keyword", "remove"):
            target = parser.property_reference("a property name after REMOVE")
            _check_settable(parser, target, parser.tokens[parser.i - 1])
            statements.append(RemoveStatement(target))
            continuing_set = False
        elif continuing_set and parser.token.kind == "ident":
            statements.append(_assignment(parser))
        else:
            raise parser.fail("SET or REMOVE")
        if len(statements) > MAX_ACTION_STATEMENTS:
            raise ValueError(f"an action has at most {MAX_ACTION_STATEMENTS} statements")
        separator = parser.take("op", ",") or parser.take("op", ";")
        if separator is None or parser.token.kind == "end":
            if separator is None or separator.text == ";":
                break
            raise parser.fail("a statement after ','")
        if separator.text == ";":
            continuing_set = False
    parser.end()
    return tuple(statements)


def _assignment(parser: _Parser) -> SetStatement:
    start = parser.token
    target = parser.property_reference("a property name to SET")
    _check_settable(parser, target, start)
    parser.expect("op", "=", "'=' after the property to SET")
    value_token = parser.token
    value = parser.sum()
    if target.scope == "sys" and target.name in ID_PROPERTIES and isinstance(value, Constant) \
            and isinstance(value.value, str) and not 0 < len(value.value) <= MAX_ID_LENGTH:
        raise _error(parser.text, value_token.pos, f"sys.{target.name} is 1 to {MAX_ID_LENGTH} characters; this "
                     f"string has {len(value.value)}")
    return SetStatement(target, value)


def _check_settable(parser: _Parser, target: Property, token: Token) -> None:
    if target.scope == "sys" and target.name not in SETTABLE_SYSTEM_PROPERTIES:
        raise _error(parser.text, token.pos, f"sys.{target.name} cannot be changed by an action; settable system "
                     f"properties are {', '.join(sorted(SETTABLE_SYSTEM_PROPERTIES))}")


def parameters_used(node: object) -> set[str]:
    """Names of the @parameters a tree (or statements) refers to."""
    if isinstance(node, Parameter):
        return {node.name}
    if isinstance(node, (tuple, list)):
        return set().union(*(parameters_used(n) for n in node)) if node else set()
    if hasattr(node, "__dataclass_fields__"):
        return set().union(*(parameters_used(getattr(node, f)) for f in node.__dataclass_fields__))
    return set()
