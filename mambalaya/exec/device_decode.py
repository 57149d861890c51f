"""Decode kept on the device: a token's layers run on resident states, their launches replayed as one CUDA graph.

On a GPU a generated token was host-bound: each of its layers sent its inputs, launched its groups from Python and
fetched its outputs (0.5-0.7 ms a layer for 0.1-0.2 ms of kernels, measured on an H100). Here the hidden state,
every layer's conv and SSM states and the blocks' norm weights live on the device; a token's mixers run the same
compiled programs with ``to_host`` off (:func:`~mambalaya.exec.triton_backend.run_program`), the states are
advanced in place, and on CUDA the whole sequence is captured once as a graph (and the head as another) and
replayed per token: one launch from Python, the token id in, the logits out. Without CUDA (Triton's interpreter
on a CPU) the same sequence runs eagerly, which is how the tests check it computes what the host loop does.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def rms_norm(h: Any, w: Any, eps: float) -> Any:
    """The blocks' RMSNorm (transformers' MambaRMSNorm) on numpy arrays or torch tensors alike."""
    return h / ((h * h).sum(-1)[..., None] / h.shape[-1] + eps) ** 0.5 * w


class DeviceDecoder:
    """The decode and head stages of a :class:`~mambalaya.exec.generate.Generator` on the Triton backend's device,
    from the states a prefill left (``states``: per layer, the decode cascade's conv and SSM state inputs)."""

    def __init__(self, gen: Any, states: list[dict[str, np.ndarray]], conv: tuple[str, str], ssm: tuple[str, str]):
        import torch

        from mambalaya.exec.triton_backend import device_of, run_program

        self.torch, self.run_program = torch, run_program
        self.gen = gen
        self.decode, self.head = gen.stage("decode"), gen.stage("head")
        self.dev = device_of(None)
        tdt = torch.float64 if gen.dtype == "float64" else torch.float32
        self.conv, self.ssm = conv, ssm  # (input name, output name) of each state in the decode cascade

        def put(a: np.ndarray) -> Any:
            return torch.from_numpy(np.ascontiguousarray(a, dtype=gen.dtype)).to(self.dev)

        self.states = [{conv[0]: put(st[conv[0]]), ssm[0]: put(st[ssm[0]])} for st in states]
        self.norms = [put(w) for w in gen.weights.norms]
        self.eps = float(gen.model.eps)
        self.x = torch.zeros(self.decode.cascade.shape("U"), dtype=tdt, device=self.dev)  # the token's embedding
        self.hidden = torch.zeros(self.head.cascade.shape("U"), dtype=tdt, device=self.dev)
        self.logits = torch.zeros(self.head.cascade.shape("LOGITS"), dtype=tdt, device=self.dev)
        self.graphs: tuple[Any, Any] | None = None
        if self.dev.type == "cuda" and all(gk.kernel is not None for s in (self.decode, self.head)
                                           for gk in s.program.groups):
            self.graphs = self._capture()

    def _mixers(self) -> None:
        """Every block on ``x``: the last hidden state into ``hidden``, each layer's states advanced in place."""
        h = self.x
        bound = self.gen._layer_inputs("decode", self.decode)
        for w, b, st in zip(self.norms, bound, self.states, strict=True):
            out = self.run_program(self.decode.program, {**b, "U": rms_norm(h, w, self.eps), **st}, count=False,
                                   to_host=False).outputs
            h = h + out["OUT"].reshape(h.shape)
            st[self.conv[0]].copy_(out[self.conv[1]])
            st[self.ssm[0]].copy_(out[self.ssm[1]])
        self.hidden.copy_(h[:, -1].reshape(self.hidden.shape))

    def _head(self) -> None:
        (b,) = self.gen._layer_inputs("head", self.head)
        out = self.run_program(self.head.program, {**b, "U": self.hidden}, count=False, to_host=False).outputs
        self.logits.copy_(out["LOGITS"])

    def _capture(self) -> tuple[Any, Any]:
        """Both sequences captured (warmed up on a side stream first, which runs them once: the states are put
        back as they were)."""
        from mambalaya.exec.triton_backend import capture_graph

        kept = [{k: v.clone() for k, v in st.items()} for st in self.states]
        graphs = capture_graph(self.torch, self._mixers), capture_graph(self.torch, self._head)
        for st, old in zip(self.states, kept, strict=True):
            for k, v in old.items():
                st[k].copy_(v)
        self.torch.cuda.synchronize()
        return graphs

    def step(self, embedded: np.ndarray) -> np.ndarray:
        """One token (its embedding, shaped as the decode cascade's ``U``) through every block: the last hidden
        state, on the host."""
        self.x.copy_(self.torch.from_numpy(np.ascontiguousarray(embedded, dtype=self.gen.dtype)).reshape(self.x.shape))
        if self.graphs is not None:
            self.graphs[0].replay()
        else:
            self._mixers()
        return self.hidden.cpu().numpy().copy()  # (on a CPU .cpu() is the tensor itself: the next step overwrites it)

    def logits_of(self, hidden: np.ndarray) -> np.ndarray:
        """The next-token logits [vocab] of a last hidden state (the final norm and head)."""
        self.hidden.copy_(self.torch.from_numpy(np.ascontiguousarray(hidden, dtype=self.gen.dtype))
                          .reshape(self.hidden.shape))
        if self.graphs is not None:
            self.graphs[1].replay()
        else:
            self._head()
        return self.logits.cpu().numpy()[0].copy()


__all__ = ["DeviceDecoder", "rms_norm"]
