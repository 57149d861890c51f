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


#: Deepest nesting of brackets an expression may have: both grammars recurse once per level (and so does
#: everything that walks the tree), so a file nesting thousands deep is refused here, with a reason.
MAX_NESTING = 64


class TokenStream:
    """A cursor over tokens with the error helpers both grammars need."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.pos = 0
        depth = 0
        for tok in self.tokens:
            if tok.kind == "op" and tok.text in "([":
                depth += 1
                if depth > MAX_NESTING:
                    self.fail(f"brackets nest more than {MAX_NESTING} deep: split the expression into several "
                              "Einsums", tok)
            elif tok.kind == "op" and tok.text in ")]":
                depth -= 1

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
        found = "end of text" if tok.kind == "end" else f"'{tok.text[:40]}'"
        text = self.text
        if len(text) > 120:  # (a long line: the stretch around the column, not all of it)
            lo = max(0, tok.col - 50)
            text = ("..." if lo else "") + text[lo:tok.col + 50] + ("..." if tok.col + 50 < len(text) else "")
        raise CascadeError(f"{message}, found {found} at column {tok.col + 1} in '{text}'")
