"""Small cascades and a round-number architecture, so traffic and time can be worked out by hand."""

from __future__ import annotations

import pytest

from mambalaya.arch import parse_arch
from mambalaya.parse import parse_cascade_text

# 1e12 matrix MAC/s, 1e11 element-wise op/s, 1e10 special-function op/s, 1 GB/s off chip, 1 us per group.
TINY_ARCH = """
name: tiny
kind: accelerator
can_fuse: true
clock: 1 GHz
units:
  mat: {peak: 1000 op/cycle}
  vec: {peak: 100 op/cycle}
  sfu: {peak: 10 op/cycle}
ops:
  mac: {unit: vec, cost: 1, matrix_unit: mat, matrix_cost: 1}
  add: {unit: vec, cost: 1}
  mul: {unit: vec, cost: 1}
  max: {unit: vec, cost: 1}
  div: {unit: sfu, cost: 1}
  exp: {unit: sfu, cost: 1}
  log: {unit: sfu, cost: 1}
  sqrt: {unit: sfu, cost: 1}
  rsqrt: {unit: sfu, cost: 1}
  sigmoid: {unit: sfu, cost: 1}
  silu: {unit: sfu, cost: 1}
  softplus: {unit: sfu, cost: 1}
buffers:
  - {name: buf, capacity: 1 MiB, bandwidth: 1 TB/s, holds_fused: true}
offchip: {bandwidth: 1 GB/s}
overheads: {per_group: 1 us}
"""

MLP = """
name: mlp
params: {M: 8, K: 4, N: 6, P: 2}
ranks: {m: M, k: K, n: N, p: P}
tensors: {W1: {role: weight}, W2: {role: weight}}
einsums:
  - T[m,n] = A[m,k] * W1[k,n]
  - Y[m,p] = T[m,n] * W2[n,p]
"""

ELTWISE = """
name: eltwise
params: {N: 10}
ranks: {i: N}
einsums:
  - B[i] = exp(A[i])
  - C[i] = B[i] * B[i]
  - D[i] = B[i] + C[i]
"""

SCAN = """
name: scan
params: {L: 5, N: 3}
ranks: {l: L, n: N}
tensors:
  H: {init: H0}
  H0: {role: input}
einsums:
  - DA[l,n] = exp(A[l,n])
  - H[l,n] = DA[l,n] * H[l-1,n] + X[l,n]
  - Y[l] = sum_n(C[l,n] * H[l,n])
  - Z[l,n] = H[l-1,n] + X[l,n]
  - HF[n] = H[L-1,n]
"""


@pytest.fixture(scope="session")
def tiny():
    return parse_arch(TINY_ARCH, file="tiny.yaml")


@pytest.fixture(scope="session")
def mlp():
    return parse_cascade_text(MLP, file="mlp.yaml")


@pytest.fixture(scope="session")
def eltwise():
    return parse_cascade_text(ELTWISE, file="eltwise.yaml")


@pytest.fixture(scope="session")
def scan():
    return parse_cascade_text(SCAN, file="scan.yaml")
