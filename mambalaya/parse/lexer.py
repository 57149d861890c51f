"""A tokenizer shared by the size-expression and Einsum grammars.

Hand-written because the language is tiny and every error must point at the
offending token's column; no user text ever reaches ``eval``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mambalaya.errors import CascadeError

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<num>(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?)
  | (?P<name>[A-Za-z][A-Za-z0-9_]*)
  | (?P<op>\*\*|//|<=|>=|==|!=|[-+*/%()\[\],=<>^])
    """,
    re.VERBOSE,
)


@dataclass(frozen=True)
class Token:
    kind: str  # "num", "name", "op", "end"
    text: str
    col: int


def tokenize(text: str) -> list[Token]:
    """Split ``text`` into tokens, or raise naming the first bad character."""
    tokens: list[Token] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise CascadeError(f"unexpected character {text[pos]!r} at column {pos + 1} in '{text}'")
        kind = m.lastgroup
        if kind != "ws":
            tokens.append(Token(kind, m.group(), pos))
        pos = m.end()
    tokens.append(Token("end", "", len(text)))
    return tokens


class TokenStream:
    """A cursor over tokens with the error helpers both grammars need."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.pos = 0

    @property
    def peek(self) -> Token:
        return self.tokens[self.pos]

    def next(self) -> Token:
        tok = self.tokens[self.pos]
        self.pos += 1
        return tok

    def accept(self, text: str) -> bool:
        if self.peek.text == text and self.peek.kind in ("op", "name"):
            self.pos += 1
            return True
        return False

    def expect(self, text: str, what: str = "") -> Token:
        if self.peek.text != text:
            self.fail(f"expected '{text}'{what}")
        return self.next()

    def fail(self, message: str, tok: Token | None = None) -> None:
        tok = tok or self.peek
        found = "end of text" if tok.kind == "end" else f"'{tok.text}'"
        raise CascadeError(f"{message}, found {found} at column {tok.col + 1} in '{self.text}'")
