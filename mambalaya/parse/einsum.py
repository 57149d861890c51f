"""Parser for one Einsum statement of the extended-Einsum language.

Grammar::

    einsum    := access '=' expr ('where' compare ('and' compare)*)?
    access    := NAME '[' index (',' index)* ']'
    expr      := term (('+' | '-') term)*
    term      := factor (('*' | '/') factor)*
    factor    := '-' factor | primary
    primary   := NUMBER | access | PARAM | FUNC '(' expr (',' expr)* ')'
               | REDUCE '_' RANK '(' expr ')' | '(' expr ')'
    compare   := index ('<=' | '<' | '>=' | '>' | '==' | '!=') index

``index`` is the size grammar of :mod:`mambalaya.parse.sizes` over rank
variables and params. Semantic checks (ranks, recurrences, shapes) belong to
the cascade builder; this module only turns text into typed nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from mambalaya.errors import CascadeError
from mambalaya.ir.expr import (
    COMPARE_OPS,
    REDUCE_OPS,
    Access,
    BinOp,
    Call,
    Compare,
    Const,
    Node,
    ParamRef,
    Reduce,
    children,
    param_symbol,
    rank_symbol,
)
from mambalaya.ir.functions import FUNCTIONS
from mambalaya.parse.lexer import TokenStream
from mambalaya.parse.sizes import parse_index_expr


@dataclass(frozen=True)
class ParsedEinsum:
    output: Access
    expr: Node
    where: tuple[Compare, ...]


class _Parser:
    def __init__(self, text: str, ranks: set[str], params: set[str]) -> None:
        self.s = TokenStream(text)
        self.ranks = ranks
        self.params = params

    def resolve_index_name(self, name: str) -> sympy.Expr:
        if name in self.ranks:
            return rank_symbol(name)
        if name in self.params:
            return param_symbol(name)
        raise CascadeError(f"unknown rank '{name}': declare it under 'ranks:' (or as a param)")

    def index(self) -> sympy.Expr:
        return parse_index_expr(self.s, self.resolve_index_name)

    def access(self) -> Access:
        name = self.s.next()
        self.s.expect("[", f" after tensor name '{name.text}'")
        indices = [self.index()]
        while self.s.accept(","):
            indices.append(self.index())
        self.s.expect("]", f" to close '{name.text}['")
        return Access(name.text, tuple(indices))

    def einsum(self) -> ParsedEinsum:
        if self.s.peek.kind != "name":
            self.s.fail("an Einsum starts with its output tensor, like 'Y[m,n] = ...'")
        output = self.access()
        for tok_ix, ix in enumerate(output.indices):
            if not (ix.is_Symbol and str(ix) in self.ranks):
                raise CascadeError(
                    f"output index {tok_ix + 1} of {output.tensor} is '{ix}': an output is indexed by plain "
                    f"rank variables (read with index expressions instead)"
                )
        names = [str(ix) for ix in output.indices]
        if len(set(names)) != len(names):
            raise CascadeError(f"output {output.tensor}[{','.join(names)}] repeats a rank")
        self.s.expect("=", " after the output tensor")
        expr = self.expr()
        where: list[Compare] = []
        if self.s.accept("where"):
            where.append(self.compare())
            while self.s.accept("and"):
                where.append(self.compare())
        if self.s.peek.kind != "end":
            self.s.fail("unexpected text after the expression")
        if (depth := tree_depth(expr)) > MAX_DEPTH:
            raise CascadeError(f"the expression is {depth} operations deep (at most {MAX_DEPTH}: everything that "
                               "walks it recurses once per level): split it into several Einsums, or sum the terms "
                               "with a reduction (sum_r) over a rank")
        return ParsedEinsum(output, expr, tuple(where))

    def compare(self) -> Compare:
        lhs = self.index()
        op = self.s.peek.text
        if op not in COMPARE_OPS:
            self.s.fail(f"expected a comparison ({' '.join(COMPARE_OPS)})")
        self.s.next()
        return Compare(lhs, op, self.index())

    def expr(self) -> Node:
        node = self.term()
        while self.s.peek.text in ("+", "-"):
            op = self.s.next().text
            node = BinOp(op, node, self.term())
        return node

    def term(self) -> Node:
        node = self.factor()
        while self.s.peek.text in ("*", "/"):
            op = self.s.next().text
            node = BinOp(op, node, self.factor())
        return node

    def factor(self) -> Node:
        if self.s.accept("-"):
            inner = self.factor()
            if isinstance(inner, Const):
                return Const(-inner.value)
            return Call("neg", (inner,))
        return self.primary()

    def primary(self) -> Node:
        tok = self.s.peek
        if tok.kind == "num":
            self.s.next()
            return Const(float(tok.text))
        if tok.text == "(":
            self.s.next()
            node = self.expr()
            self.s.expect(")", " to close '('")
            return node
        if tok.kind != "name":
            self.s.fail("expected a tensor, a number, a function or '('")
        after = self.s.tokens[self.s.pos + 1].text
        if after == "[":
            return self.access()
        if after == "(":
            return self.call()
        self.s.next()
        if tok.text in self.params:
            return ParamRef(tok.text)
        self.s.fail(f"'{tok.text}' is neither a tensor (write {tok.text}[...]) nor a param", tok)
        raise AssertionError("unreachable")

    def call(self) -> Node:
        tok = self.s.next()
        name = tok.text
        op, _, rank = name.partition("_")
        self.s.expect("(")
        args = [self.expr()]
        while self.s.accept(","):
            args.append(self.expr())
        self.s.expect(")", f" to close '{name}('")
        if name in FUNCTIONS:
            fn = FUNCTIONS[name]
            if len(args) != fn.arity:
                self.s.fail(f"{name}() takes {fn.arity} argument(s), got {len(args)}", tok)
            return Call(name, tuple(args))
        if op in REDUCE_OPS and rank:
            if rank not in self.ranks:
                self.s.fail(f"{name}(): unknown rank '{rank}' to reduce over", tok)
            if len(args) != 1:
                self.s.fail(f"{name}() takes one argument", tok)
            return Reduce(op, rank, args[0])
        known = ", ".join(sorted(FUNCTIONS)) + "; reductions " + ", ".join(f"{r}_RANK" for r in REDUCE_OPS)
        self.s.fail(f"unknown function '{name}' (known: {known})", tok)
        raise AssertionError("unreachable")


#: Longest Einsum statement read (the shipped ones are under 120 characters): a longer line is refused before
#: it is tokenized, so a runaway generated file fails at once.
MAX_CHARS = 10_000
#: Deepest expression tree an Einsum may have (a chain of ``a + b + c ...`` is as deep as it is long).
MAX_DEPTH = 256


def tree_depth(node: Node) -> int:
    """How deep an expression tree is, walked without recursion (it may be deeper than Python recurses)."""
    best, stack = 0, [(node, 1)]
    while stack:
        n, d = stack.pop()
        best = max(best, d)
        stack.extend((c, d + 1) for c in children(n))
    return best


def parse_einsum(text: str, ranks: set[str], params: set[str]) -> ParsedEinsum:
    """Parse ``text`` (one Einsum) given the declared rank and param names."""
    if len(text) > MAX_CHARS:
        raise CascadeError(f"an Einsum of {len(text)} characters (at most {MAX_CHARS}): split it into several "
                           f"Einsums, or sum its terms with a reduction (sum_r) over a rank; it starts '{text[:60]}...'")
    return _Parser(text, ranks, params).einsum()
