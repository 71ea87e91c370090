"""Naive references for the objectives tests, written from the papers with Python loops in
float64 — deliberately not sharing code (or vectorized tricks) with ``objectives/``.

Each function takes Python floats or 0-d float64 tensors (the elementary functions below
dispatch on the type), so the same reference gives values and, on tensors, autograd gradients.
"""

from __future__ import annotations

import math

import torch


def _lib(x):
    return torch if isinstance(x, torch.Tensor) else math


def exp(x):
    return _lib(x).exp(x)


def log(x):
    return _lib(x).log(x)


def sqrt(x):
    return _lib(x).sqrt(x)


def lse(xs):
    m = max(xs)
    if m == -math.inf:
        return -math.inf
    return m + log(sum(exp(x - m) for x in xs))


def ref_log_partition_lse(log_w):
    return lse(log_w) - math.log(len(log_w))


def ref_geomean(log_w):
    return sum(log_w) / len(log_w)


def ref_ess(log_w):
    w = [exp(x) for x in log_w]
    return sum(w) ** 2 / sum(v * v for v in w)


def ref_delta_bias(log_w):
    """-Var_hat(w) / (2 M Z_hat^2) with the unbiased sample variance."""
    m = len(log_w)
    w = [exp(x) for x in log_w]
    z = sum(w) / m
    var = sum((v - z) ** 2 for v in w) / (m - 1)
    return -var / (2 * m * z * z)


def ref_tb_residual(logp, logp_ref, r, log_z, beta):
    return [log_z[i] + logp[i] - logp_ref[i] - beta * r[i] for i in range(len(logp))]


def ref_divergence(name, x):
    if name == "kl":
        return x * log(x)
    if name == "rkl":
        return -log(x)
    if name == "jeffreys":
        return (x - 1) * log(x)
    if name == "tv":
        return abs(x - 1)
    if name == "hellinger":
        return 0.5 * (sqrt(x) - 1) ** 2
    if name == "js":
        return 0.5 * (x * log(x) - (x + 1) * log((x + 1) / 2))
    raise KeyError(name)


def ref_group_adv(row, eps=1e-6):
    g = len(row)
    mu = sum(row) / g
    sd = sqrt(sum((v - mu) ** 2 for v in row) / (g - 1))  # sample std (n - 1), as TRL and veRL
    return [(v - mu) / (sd + eps) for v in row]


def ref_sigmoid(x):
    return 1 / (1 + exp(-x))
