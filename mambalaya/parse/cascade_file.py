"""Load a cascade file (YAML) into a validated :class:`~mambalaya.ir.cascade.Cascade`.

YAML is read with the safe loader and composed node by node so that every
error can name the file and line; duplicate keys (which PyYAML silently
overwrites) are errors. The core keys are fixed (README, "The language"):
``name``, ``params``, ``ranks``, ``tensors``, ``einsums``. Extensions:
``derived`` (named size expressions over params), ``description``, and
``config`` (how a Hugging Face config's fields map to params).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import networkx as nx
import sympy
import yaml

from mambalaya.errors import CascadeError, did_you_mean
from mambalaya.fileio import compose_yaml, read_text
from mambalaya.ir.cascade import DTYPE_BYTES, ROLES, Cascade, Einsum, Recurrence, TensorSpec, is_plain_rank
from mambalaya.ir.expr import Access, Reduce, accesses, free_ranks, param_symbol, walk
from mambalaya.ir.sizes import substitute
from mambalaya.parse.einsum import parse_einsum
from mambalaya.parse.sizes import parse_size

TOP_KEYS = ("name", "description", "params", "derived", "ranks", "tensors", "einsums", "config")
TENSOR_KEYS = ("role", "dtype", "shape", "source", "init", "description")
_IDENT = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_NUMBER = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")  # what a person writes for a number


# ---- YAML with line numbers ---------------------------------------------
def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _to_python(node: yaml.Node, file: str | None) -> Any:
    """Convert a composed node to Python, rejecting duplicate keys."""
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _to_python(key_node, file)
            if isinstance(key, list | dict):  # (``? [a, b]``, ``[a]: 1``: YAML allows it, nothing here names one)
                raise CascadeError("a key is a list or a map: keys are names", file=file, line=_line(key_node))
            if key in out:
                raise CascadeError(f"key '{key}' appears twice: keep one", file=file, line=_line(key_node))
            out[key] = _to_python(value_node, file)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_to_python(v, file) for v in node.value]
    try:
        return _scalar(node)
    except yaml.YAMLError as err:  # (a tag such as ``!vocab:`` that safe YAML has no constructor for)
        raise CascadeError(f"cannot read this value: {getattr(err, 'problem', None) or err}", file=file,
                           line=_line(node)) from None


def _scalar(node: yaml.ScalarNode) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()


def _mapping_lines(node: yaml.Node, key: str) -> dict[str, int]:
    """Line of each key in the mapping under top-level ``key``."""
    sub = _child(node, key)
    if not isinstance(sub, yaml.MappingNode):
        return {}
    return {str(k.value): _line(k) for k, _ in sub.value}


def _child(node: yaml.Node, key: str) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if k.value == key:
                return v
    return None


# ---- entry points -------------------------------------------------------
def load_cascade(path: str | Path, **overrides: int | float) -> Cascade:
    """Read and validate a cascade file; ``overrides`` replace params."""
    text = read_text(path, CascadeError, "cascade file")
    return parse_cascade_text(text, file=str(path), **overrides)


def parse_cascade_text(text: str, file: str | None = None, **overrides: int | float) -> Cascade:
    """Validate a cascade given as YAML text."""
    root = compose_yaml(text, file, CascadeError)
    if root is None or not isinstance(root, yaml.MappingNode):
        raise CascadeError("a cascade file is a YAML mapping with keys name, params, ranks, einsums", file=file,
                           line=_line(root) if root is not None else 1)
    data = _to_python(root, file)
    return _Builder(data, root, file).build(overrides)


def cascade_from_dict(data: dict[str, Any], **overrides: int | float) -> Cascade:
    """Validate a cascade given as a Python dict of the file's keys (the API's way in)."""
    text = yaml.safe_dump(data, sort_keys=False)
    return parse_cascade_text(text, file=f"<cascade {data.get('name', '?')}>", **overrides)


# ---- the builder --------------------------------------------------------
class _Builder:
    def __init__(self, data: dict[str, Any], root: yaml.Node, file: str | None) -> None:
        self.data = data
        self.root = root
        self.file = file

    def error(self, message: str, line: int | None = None) -> CascadeError:
        return CascadeError(message, file=self.file, line=line)

    def top_line(self, key: str) -> int | None:
        for k, _ in self.root.value:
            if k.value == key:
                return _line(k)
        return None

    def build(self, overrides: dict[str, int | float]) -> Cascade:
        for key in self.data:
            if key not in TOP_KEYS:
                did = did_you_mean(key, TOP_KEYS) or f" (known keys: {', '.join(TOP_KEYS)})"
                raise self.error(f"unknown key '{key}'{did}", self.top_line(str(key)))
        for key in ("name", "einsums"):
            if key not in self.data:
                raise self.error(f"missing key '{key}'", 1)
        name = self.data["name"]
        if not isinstance(name, str) or not name:
            raise self.error("'name' must be a non-empty string", self.top_line("name"))

        params = self.params()
        unknown = sorted(set(overrides) - set(params))
        if unknown:
            raise self.error(
                f"unknown param(s) {', '.join(unknown)} (this cascade's params: {', '.join(sorted(params))})"
            )
        params.update(overrides)
        derived = self.derived(params)
        ranks = self.ranks(params, derived)
        einsums = self.einsums(ranks, params, derived)
        tensors = self.tensors(einsums, ranks, params, derived)
        einsums = self.recurrences(einsums, tensors)
        self.check_graph(einsums)
        cascade = Cascade(
            name=name,
            params=params,
            derived=derived,
            rank_exprs=ranks,
            tensors=tensors,
            einsums=tuple(einsums),
            file=self.file,
            meta={k: self.data[k] for k in ("description", "config") if k in self.data},
        )
        self.check_bound(cascade)
        return cascade

    # -- params, derived sizes, ranks
    def params(self) -> dict[str, int | float]:
        raw = self.data.get("params", {}) or {}
        lines = _mapping_lines(self.root, "params")
        if not isinstance(raw, dict):
            raise self.error("'params' must be a mapping of name: number", self.top_line("params"))
        out: dict[str, int | float] = {}
        for k, v in raw.items():
            if not isinstance(k, str) or not _IDENT.match(k):
                raise self.error(f"param name {k!r} is not an identifier", lines.get(str(k)))
            if isinstance(v, str) and _NUMBER.match(v.strip()):
                v = float(v)  # 1e-5: YAML 1.1 reads a float without a dot as text
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise self.error(f"param '{k}' must be a number, got {v!r}", lines.get(k))
            out[k] = v
        return out

    def derived(self, params: dict[str, int | float]) -> dict[str, sympy.Expr]:
        raw = self.data.get("derived", {}) or {}
        lines = _mapping_lines(self.root, "derived")
        if not isinstance(raw, dict):
            raise self.error("'derived' must be a mapping of name: size expression", self.top_line("derived"))
        out: dict[str, sympy.Expr] = {}
        for k, v in raw.items():
            if not isinstance(k, str) or not _IDENT.match(k) or k in params:
                raise self.error(f"derived name {k!r} must be a new identifier", lines.get(str(k)))
            out[k] = self.size(v, set(params) | set(out), lines.get(k), f"derived '{k}'")
        return out

    def size(self, text: Any, names: set[str], line: int | None, what: str) -> sympy.Expr:
        def resolve(n: str) -> sympy.Expr:
            if n in names:
                return param_symbol(n)
            raise CascadeError(f"unknown name '{n}' in {what} (params: {', '.join(sorted(names)) or 'none'})")

        try:
            return parse_size(text, resolve)
        except CascadeError as err:
            raise self.error(f"{what}: {err.message}", line) from None

    def ranks(self, params: dict[str, Any], derived: dict[str, sympy.Expr]) -> dict[str, sympy.Expr]:
        raw = self.data.get("ranks")
        lines = _mapping_lines(self.root, "ranks")
        if not isinstance(raw, dict) or not raw:
            raise self.error("'ranks' must be a mapping of rank: size expression", self.top_line("ranks") or 1)
        out: dict[str, sympy.Expr] = {}
        for k, v in raw.items():
            if not isinstance(k, str) or not _IDENT.match(k) or "_" in k:
                raise self.error(f"rank name {k!r} must be an identifier without '_'", lines.get(str(k)))
            if k in params or k in derived:
                raise self.error(f"rank '{k}' has the name of a param: rename one", lines.get(k))
            out[k] = self.size(v, set(params) | set(derived), lines.get(k), f"size of rank '{k}'")
        return out

    # -- einsums
    def einsum_lines(self) -> list[int | None]:
        node = _child(self.root, "einsums")
        if isinstance(node, yaml.SequenceNode):
            return [_line(v) for v in node.value]
        return []

    def einsums(self, ranks: dict, params: dict, derived: dict) -> list[Einsum]:
        raw = self.data["einsums"]
        if not isinstance(raw, list) or not raw:
            raise self.error("'einsums' must be a non-empty list of Einsum strings", self.top_line("einsums"))
        lines = self.einsum_lines()
        rank_names, param_names = set(ranks), set(params) | set(derived)
        out: list[Einsum] = []
        written: dict[str, int | None] = {}
        for text, line in zip(raw, lines, strict=True):
            if not isinstance(text, str):
                raise self.error(f"an Einsum must be a string like 'Y[m] = A[m,k] * B[k]', got {text!r}", line)
            text = " ".join(text.split())
            try:
                parsed = parse_einsum(text, rank_names, param_names)
            except CascadeError as err:
                raise self.error(err.message, line) from None
            e = Einsum(parsed.output, parsed.expr, parsed.where, text, line)
            if e.name in written:
                raise self.error(f"tensor {e.name} is written twice (first at line {written[e.name]}): "
                                 f"every tensor has one writer; rename one", line)
            if e.name in ranks or e.name in param_names:
                raise self.error(f"tensor {e.name} has the name of a rank or param: rename it", line)
            self.check_einsum(e, line)
            written[e.name] = line
            out.append(e)
        return out

    def check_einsum(self, e: Einsum, line: int | None) -> None:
        out = set(e.out_ranks)
        for node in walk(e.expr):
            if isinstance(node, Reduce):
                inner = free_ranks(node.arg)
                if node.rank not in inner:
                    raise self.error(f"{node.op}_{node.rank}(...): rank {node.rank} does not index its argument",
                                     line)
                if node.op != "cumsum" and node.rank in out:
                    raise self.error(f"{node.op}_{node.rank}(...) reduces {node.rank}, which indexes the output "
                                     f"{e.name}: reduce another rank or drop it from the output", line)
        missing = [r for r in e.out_ranks if r not in free_ranks(e.expr)]
        if missing:
            raise self.error(f"output rank(s) {', '.join(missing)} of {e.name} index no operand: every output "
                             f"rank must index some tensor on the right-hand side", line)
        for cmp in e.where:
            if not cmp.ranks():
                raise self.error(f"predicate '{cmp}' names no rank", line)
        masked = {r for cmp in e.where for r in cmp.ranks()}
        if masked - out and len(e.terms()) > 1:
            raise self.error(f"'where' names summed rank(s) {', '.join(sorted(masked - out))} in an Einsum of "
                             f"several terms: mask a single term, or split the Einsum", line)
        stray = masked - set(free_ranks(e.expr)) - out
        if stray:
            raise self.error(f"'where' names rank(s) {', '.join(sorted(stray))} that index no operand", line)

    def recurrences(self, einsums: list[Einsum], tensors: dict[str, TensorSpec]) -> list[Einsum]:
        out = []
        inits = {n: spec for n, spec in self._tensor_meta().items() if spec.get("init")}
        for e in einsums:
            selfreads = [a for a in accesses(e.expr) if a.tensor == e.name]
            rec = None
            if selfreads:
                rank = self.recurrence_rank(e, selfreads)
                rec = Recurrence(rank, e.out_ranks.index(rank), None)
            meta = inits.pop(e.name, None)
            if meta is not None:
                if rec is None:
                    raise self.error(f"tensor {e.name} has 'init' but its Einsum is not a recurrence "
                                     f"(it never reads {e.name} at a step back)", self._tensor_line(e.name))
                rec = Recurrence(rec.rank, rec.position, meta["init"])
            if rec is not None:
                e = Einsum(e.output, e.expr, e.where, e.text, e.line, rec)
            out.append(e)
        for name in inits:
            raise self.error(f"tensor {name} has 'init' but no Einsum writes it", self._tensor_line(name))
        return out

    def recurrence_rank(self, e: Einsum, selfreads: list[Access]) -> str:
        found: set[str] = set()
        for acc in selfreads:
            diffs = [(r, ix - sympy.Symbol(r, integer=True, nonnegative=True))
                     for r, ix in zip(e.out_ranks, acc.indices, strict=False)]
            steps = [(r, d) for r, d in diffs if d != 0]
            if len(acc.indices) != len(e.out_ranks) or len(steps) != 1 or steps[0][1] != -1:
                raise self.error(
                    f"{e.name} reads itself as {acc}: a recurrence reads its own output at exactly one rank "
                    f"one step back (like {e.name}[...,i-1,...]) and at the output's other indices", e.line)
            found.add(steps[0][0])
        if len(found) > 1:
            raise self.error(f"{e.name} recurs along several ranks ({', '.join(sorted(found))}): only one "
                             f"iterative rank per Einsum", e.line)
        return found.pop()

    def check_graph(self, einsums: list[Einsum]) -> None:
        g = nx.DiGraph()
        names = {e.name: e for e in einsums}
        order = {e.name: i for i, e in enumerate(einsums)}
        for e in einsums:
            g.add_node(e.name)
            for t in e.reads:
                if t in names and t != e.name:
                    g.add_edge(t, e.name)
        try:
            cycle = nx.find_cycle(g)
        except nx.NetworkXNoCycle:
            cycle = None
        if cycle:
            path = " -> ".join([u for u, _ in cycle] + [cycle[0][0]])
            raise self.error(f"cycle {path} is not a recurrence: only an Einsum reading its own output one step "
                             f"back along a rank (X[i-1]) may loop",
                             min((names[u] for u, _ in cycle), key=lambda e: order[e.name]).line)
        for e in einsums:
            for t in e.reads:
                if t in names and t != e.name and order[t] > order[e.name]:
                    raise self.error(f"{e.name} reads {t} before the Einsum that writes it (line "
                                     f"{names[t].line}): list Einsums in execution order", e.line)

    # -- tensors
    def _tensor_meta(self) -> dict[str, dict[str, Any]]:
        raw = self.data.get("tensors", {}) or {}
        if not isinstance(raw, dict):
            raise self.error("'tensors' must be a mapping of tensor: {role, dtype, shape, ...}",
                             self.top_line("tensors"))
        return {k: (v or {}) for k, v in raw.items()}

    def _tensor_line(self, name: str) -> int | None:
        return _mapping_lines(self.root, "tensors").get(name, self.top_line("tensors"))

    def tensors(self, einsums: list[Einsum], ranks: dict, params: dict, derived: dict) -> dict[str, TensorSpec]:
        meta = self._tensor_meta()
        writers = {e.name: e for e in einsums}
        readers: dict[str, list[Einsum]] = {}
        for e in einsums:
            for a in accesses(e.expr):
                if a.tensor != e.name:
                    readers.setdefault(a.tensor, []).append(e)
        init_of = {m["init"]: n for n, m in meta.items() if isinstance(m, dict) and m.get("init")}
        names = list(dict.fromkeys([n for e in einsums for n in (*[a.tensor for a in accesses(e.expr)], e.name)]))
        names += [n for n in init_of if n not in names]
        for n, m in meta.items():
            line = self._tensor_line(n)
            if not isinstance(m, dict):
                raise self.error(f"tensor {n}: expected a mapping of {', '.join(TENSOR_KEYS)}", line)
            for key in m:
                if key not in TENSOR_KEYS:
                    did = did_you_mean(key, TENSOR_KEYS) or f" (known: {', '.join(TENSOR_KEYS)})"
                    raise self.error(f"tensor {n}: unknown key '{key}'{did}", line)
            if n not in names:
                raise self.error(f"tensor {n} is declared but no Einsum reads or writes it", line)

        out: dict[str, TensorSpec] = {}
        for n in names:
            m = meta.get(n, {})
            line = self._tensor_line(n) if n in meta else None
            if "role" in m and m["role"] not in ROLES:
                raise self.error(f"tensor {n}: unknown role {m['role']!r}{did_you_mean(m['role'], ROLES)}; the roles: "
                                 f"{', '.join(ROLES)}", line)
            if n in writers:
                role = "output" if n not in readers else "intermediate"
                declared = m.get("role")
                if declared in ("input", "weight"):
                    raise self.error(f"tensor {n} is declared {declared} but line {writers[n].line} writes it", line)
                if declared == "output":
                    role = "output"
            else:
                role = m.get("role", "input")
                if role not in ("input", "weight"):
                    raise self.error(f"tensor {n} is declared {role} but no Einsum writes it: it is an input "
                                     f"or weight", line)
            if role not in ROLES:
                raise self.error(f"tensor {n}: unknown role '{role}' (one of {', '.join(ROLES)})", line)
            dtype = m.get("dtype", "float32")
            if dtype not in DTYPE_BYTES:
                raise self.error(f"tensor {n}: unknown dtype '{dtype}' (one of {', '.join(DTYPE_BYTES)})", line)
            shape, rank_names = self.shape_of(n, m, writers, readers, ranks, params, derived, init_of, meta, line)
            source = m.get("source")
            if source is not None and not isinstance(source, str):
                raise self.error(f"tensor {n}: 'source' must be a checkpoint tensor name", line)
            out[n] = TensorSpec(n, role, shape, rank_names, dtype, source, line)
        return out

    def shape_of(self, n, m, writers, readers, ranks, params, derived, init_of, meta, line):
        if n in writers:
            e = writers[n]
            shape = tuple(ranks[r] for r in e.out_ranks)
            rank_names: tuple[str | None, ...] = e.out_ranks
        elif "shape" in m:
            raw = m["shape"]
            if not isinstance(raw, list) or not raw:
                raise self.error(f"tensor {n}: 'shape' must be a list of size expressions", line)
            shape = tuple(
                ranks[s] if isinstance(s, str) and s in ranks
                else self.size(s, set(params) | set(derived), line, f"shape of {n}")
                for s in raw
            )
            rank_names = tuple(s if isinstance(s, str) and s in ranks else None for s in raw)
        elif n in init_of:
            owner = writers.get(init_of[n])
            if owner is None:
                raise self.error(f"tensor {n} is the init of {init_of[n]}, which no Einsum writes", line)
            selfread = next((a for a in accesses(owner.expr) if a.tensor == owner.name), None)
            if selfread is None:
                raise self.error(f"tensor {owner.name} has 'init' but its Einsum is not a recurrence "
                                 f"(it never reads {owner.name} at a step back)", self._tensor_line(owner.name))
            drop = next(i for i, (r, ix) in enumerate(zip(owner.out_ranks, selfread.indices, strict=True)) if str(ix) != r)
            kept = [r for i, r in enumerate(owner.out_ranks) if i != drop]
            return tuple(ranks[r] for r in kept), tuple(kept)
        else:
            shape, rank_names = None, None
        # every plain-rank read must agree with the known (or inferred) size
        seen: dict[int, tuple[str, int | None]] = {}
        for e in readers.get(n, []):
            for a in accesses(e.expr):
                if a.tensor != n:
                    continue
                if shape is not None and len(a.indices) != len(shape):
                    raise self.error(f"{e.name} reads {n} with {len(a.indices)} indices, but {n} has "
                                     f"{len(shape)} (line {self._first_use(n, writers, readers)})", e.line)
                for pos, ix in enumerate(a.indices):
                    if not is_plain_rank(ix):
                        continue
                    r = str(ix)
                    if shape is None or (n not in writers and "shape" not in m):
                        if pos in seen and seen[pos][0] != r and \
                                sympy.simplify(ranks[seen[pos][0]] - ranks[r]) != 0:
                            raise self.error(
                                f"tensor {n} position {pos + 1} is indexed by rank {seen[pos][0]} (size "
                                f"{ranks[seen[pos][0]]}, line {seen[pos][1]}) and by rank {r} (size {ranks[r]}): "
                                f"one position cannot have two sizes", e.line)
                        seen.setdefault(pos, (r, e.line))
                    elif n in writers and sympy.simplify(shape[pos] - ranks[r]) != 0:
                        raise self.error(
                            f"{e.name} reads {n} position {pos + 1} with rank {r} (size {ranks[r]}) but {n} is "
                            f"written with size {shape[pos]} there (line {writers[n].line}): one position "
                            f"cannot have two sizes; read it with an index expression if you mean a slice",
                            e.line)
        if shape is None:
            arity = {len(a.indices) for e in readers.get(n, []) for a in accesses(e.expr) if a.tensor == n}
            if len(arity) > 1:
                raise self.error(f"tensor {n} is read with {sorted(arity)} indices in different Einsums", line)
            k = arity.pop()
            missing = [p + 1 for p in range(k) if p not in seen]
            if missing:
                first = readers[n][0]
                raise self.error(
                    f"cannot infer the size of tensor {n} at position(s) {missing}: no Einsum reads it there "
                    f"with a plain rank; declare it under tensors: {n}: {{shape: [...]}}", first.line)
            rank_names = tuple(seen[p][0] for p in range(k))
            shape = tuple(ranks[r] for r in rank_names)
        return shape, rank_names

    def _first_use(self, n, writers, readers):
        if n in writers:
            return writers[n].line
        return readers[n][0].line if readers.get(n) else None

    # -- checks under the bound params
    def check_bound(self, c: Cascade) -> None:
        c.check_sizes()
        for e in c.einsums:
            for acc in accesses(e.expr):
                for ix in acc.indices:
                    value = substitute(ix, c.values, f"index {ix} of {acc.tensor}")
                    if value.is_integer is not True and not value.is_Integer:
                        raise self.error(
                            f"index '{ix}' of {acc.tensor} is not a whole number for every rank value (with "
                            f"params bound: {value}): use // for division", e.line)
