"""LAD propositions, stated and decided in sympy.

Notation: ``a = A/eta``, ``rho = pi_theta/pi_old``, ``c = rho e^{-a}``. Practical loss (eq. 8)
``L_LAD = E_{y~pi_old} e^{a} f(c)``; theoretical loss (eq. 7)
``L_thm = sum_y (e^{a}/Z_A) f(c Z_A/Z_pi)``, ``Z_A = sum_y e^{a}``, ``Z_pi = sum_y rho``.
The six generators of Table 5 are ``F_DIVERGENCES``; ``TABLE5_PRINTED`` transcribes the
table's printed loss column (mis-encoded characters restored: ``Ξ·`` = eta, ``Ο€`` = pi).
"""

from __future__ import annotations

from collections.abc import Callable

import mpmath
import numpy as np
import sympy as sp

from tiltlab.theory._common import CheckResult, Verdict, is_zero, result, simplex

__all__ = [
    "EQ9_GRAD_TOL",
    "F_DIVERGENCES",
    "LEMMA31_OPTIMUM_TOL",
    "TABLE5_PRINTED",
    "check_B5_eq18",
    "check_B5_flowrl",
    "check_eq9_gradients",
    "check_grpo_optimum",
    "check_lemma31",
    "check_lemma31_stated",
    "check_lemma32",
    "check_table5",
    "check_thmB1",
    "trust_region_optimum",
]

x = sp.Symbol("x", positive=True)

#: Table 5, column f(x) (all with f(1) = 0).
F_DIVERGENCES: dict[str, Callable[[sp.Expr], sp.Expr]] = {
    "kl": lambda u: u * sp.log(u),
    "rkl": lambda u: -sp.log(u),
    "jeffreys": lambda u: (u - 1) * sp.log(u),
    "tv": lambda u: sp.Abs(u - 1),
    "hellinger": lambda u: (sp.sqrt(u) - 1) ** 2 / 2,
    "js": lambda u: (u * sp.log(u) - (u + 1) * sp.log((u + 1) / 2)) / 2,
}


def _rho(pt, po):
    return pt / po


#: Table 5, column L_LAD, per-sample integrand of E_{y~pi_old}[.], as printed.
#: Arguments: pi_theta(y), pi_old(y), a = A/eta.
TABLE5_PRINTED: dict[str, Callable[[sp.Expr, sp.Expr, sp.Expr], sp.Expr]] = {
    "kl": lambda pt, po, a: _rho(pt, po) * (sp.log(_rho(pt, po)) - a),
    "rkl": lambda pt, po, a: -sp.exp(a) * sp.log(pt),
    "jeffreys": lambda pt, po, a: (_rho(pt, po) - sp.exp(a)) * sp.log(_rho(pt, po) * sp.exp(-a)),
    "tv": lambda pt, po, a: sp.exp(a) * sp.Abs(_rho(pt, po) * sp.exp(-a) - 1),
    "hellinger": lambda pt, po, a: sp.exp(a) * (sp.sqrt(_rho(pt, po)) * sp.exp(-a / 2) - 1) ** 2,
    # printed: e^{A/eta} ( rho e^{-A/eta} log(rho e^{-A/eta}) - (rho e^{A/eta} + 1) log( pi_theta/(2 pi_old) e^{A/eta} ) )
    "js": lambda pt, po, a: (
        sp.exp(a)
        * (
            _rho(pt, po) * sp.exp(-a) * sp.log(_rho(pt, po) * sp.exp(-a))
            - (_rho(pt, po) * sp.exp(a) + 1) * sp.log(_rho(pt, po) / 2 * sp.exp(a))
        )
    ),
}


def _f_of(div: str | Callable) -> Callable[[sp.Expr], sp.Expr]:
    if callable(div):
        return div
    try:
        return F_DIVERGENCES[div]
    except KeyError:
        raise ValueError(f"unknown divergence {div!r}; one of {sorted(F_DIVERGENCES)}") from None


# ----------------------------------------------------------------------------- Lemma 3.1
def check_lemma31(candidate: Callable[[list, list, sp.Expr], list] | None = None, K: int = 3) -> CheckResult:
    """LAD Lemma 3.1 (App. B.1): ``max_pi sum_y A pi - eta KL(pi||pi_old)`` on the simplex
    (the Lagrangian of the trust-region problem) has the optimum ``pi ∝ pi_old e^{A/eta}``.

    ``candidate(pi_old, A, eta)`` returns the (unnormalized) candidate optimum. Exact with
    K symbolic outcomes: (1) the Lagrangian gradient at the normalized candidate is the same
    for every y (KKT with the simplex multiplier); (2) the objective is strictly concave
    (Hessian diag -eta/pi_y); (3) existence of eta for a given radius: with s = 1/eta,
    ``dKL(pi_s||pi_old)/ds = s Var_{pi_s}(A) >= 0`` (K = 2 symbolic), so KL is monotone in eta.
    """
    if candidate is None:
        candidate = lambda po, A, eta: [po[i] * sp.exp(A[i] / eta) for i in range(len(po))]
    eta = sp.Symbol("eta", positive=True)
    po, _ = simplex("po", K)
    A = list(sp.symbols(f"A1:{K + 1}", real=True))
    un = candidate(po, A, eta)
    S = sum(un)
    pi = [u / S for u in un]
    grad = [A[i] - eta * (sp.log(pi[i] / po[i]) + 1) for i in range(K)]
    kkt = all(is_zero(grad[i] - grad[0]) for i in range(1, K))
    concave = True  # Hessian of sum A pi - eta sum pi log(pi/po) is diag(-eta/pi_y): negative definite
    ps = list(sp.symbols(f"pi1:{K + 1}", positive=True))
    H = [sp.diff(sum(A[i] * ps[i] - eta * ps[i] * sp.log(ps[i] / po[i]) for i in range(K)), ps[k], 2) for k in range(K)]
    concave = all(is_zero(H[k] + eta / ps[k]) for k in range(K))
    # monotonicity of KL in s = 1/eta (K = 2)
    s = sp.Symbol("s", positive=True)
    q1 = sp.Symbol("q1", positive=True)
    B = sp.symbols("B1:3", real=True)
    qo = [q1, 1 - q1]
    un2 = [qo[i] * sp.exp(s * B[i]) for i in range(2)]
    pis = [u / sum(un2) for u in un2]
    kl = sum(pis[i] * sp.log(pis[i] / qo[i]) for i in range(2))
    EA = sum(pis[i] * B[i] for i in range(2))
    var = sum(pis[i] * B[i] ** 2 for i in range(2)) - EA**2
    mono = is_zero(sp.diff(kl, s) - s * var)
    ok = kkt and concave and mono
    summ = (
        f"K={K} symbolic: Lagrangian stationarity at the candidate {'holds' if kkt else 'FAILS'} (A_y - eta(log pi/pi_old + 1) "
        f"y-independent); objective strictly concave: {concave}; dKL/d(1/eta) = (1/eta) Var_pi(A) >= 0 (K=2): {mono}"
    )
    return result(ok, summ, {"kkt": kkt, "concave": concave, "kl_monotone": mono})


def trust_region_optimum(po: np.ndarray, A: np.ndarray, eps: float, constraint: str) -> np.ndarray:
    """Optimum of ``max_pi sum_y A pi`` on the simplex subject to ``KL(pi||pi_old) <= eps``
    (``constraint="proof"``, App. B.1) or ``KL(pi_old||pi) <= eps`` (``"stated"``, Eq. 2).

    From the KKT conditions (a linear objective over a convex set: the KKT point is the global optimum),
    with the multiplier found by a 1-D root search on the active constraint:
    ``proof``: ``pi ∝ pi_old e^{s A}`` (``A_y - (1/s)(log pi_y/pi_old(y) + 1) - mu = 0``);
    ``stated``: ``pi_y = lam pi_old(y) / (mu - A_y)`` with ``mu > max A`` (``A_y + lam pi_old(y)/pi_y - mu = 0``)
    and ``lam`` normalizing."""
    from scipy.optimize import brentq

    if constraint == "proof":

        def pi_of(s: float) -> np.ndarray:
            z = np.log(po) + s * A
            p = np.exp(z - z.max())
            return p / p.sum()

        gap = lambda s: float(np.sum(pi_of(s) * np.log(pi_of(s) / po))) - eps
        hi = 1.0
        while gap(hi) < 0:
            hi *= 2
        return pi_of(brentq(gap, 0.0, hi, xtol=1e-15, rtol=1e-15))
    if constraint == "stated":
        amax = float(A.max())

        def pi_of(t: float) -> np.ndarray:  # mu = max A + 1/t, t in (0, inf): t -> 0 gives pi_old
            w = po / (1.0 + t * (amax - A))
            return w / w.sum()

        gap = lambda t: float(np.sum(po * np.log(po / pi_of(t)))) - eps
        hi = 1.0
        while gap(hi) < 0:
            hi *= 2
        return pi_of(brentq(gap, 0.0, hi, xtol=1e-15, rtol=1e-15))
    raise ValueError(f"constraint must be 'proof' or 'stated', got {constraint!r}")


#: ``lad.lemma31`` / ``lad.lemma31.stated``: the claimed optimum solves the trust-region problem iff
#: max |pi_opt - pi_eta| is at root-search precision, below this (the proof's form gives ~1e-16).
LEMMA31_OPTIMUM_TOL = 1e-8


def check_lemma31_stated(constraint: str = "stated", seed: int = 0, n_instances: int = 6) -> CheckResult:
    """LAD Lemma 3.1 as Eq. 2 states it: the constraint is ``KL(pi_old||pi) <= eps`` (the proof in
    App. B.1 solves ``KL(pi||pi_old) <= eps``). For random instances (K = 3..5, eta = 1): set eps to the
    radius of the claimed optimum ``pi_eta ∝ pi_old e^{A/eta}`` under the chosen constraint, solve the
    problem (:func:`trust_region_optimum`) and report ``max |pi_opt - pi_eta|``. The claimed optimum
    solves the problem iff that gap is at root-search precision (< :data:`LEMMA31_OPTIMUM_TOL`; the proof's
    form, run as a control, gives ~1e-16). Reported as ``max_optimum_error`` for the proof's form (a
    residual) and ``max_optimum_gap`` for the stated form (the evidence that refutes it). Independently of
    the KKT algebra, the claimed optimum is then beaten in the objective by a feasible point (the objective
    gain is reported).
    """
    rng = np.random.default_rng(seed)
    errs, gains = [], []
    for i in range(n_instances):
        K = 3 + i % 3
        po = rng.dirichlet(np.ones(K))
        A = rng.normal(size=K)
        pe = po * np.exp(A)
        pe /= pe.sum()
        eps = float(np.sum(pe * np.log(pe / po))) if constraint == "proof" else float(np.sum(po * np.log(po / pe)))
        opt = trust_region_optimum(po, A, eps, constraint)
        errs.append(float(np.abs(opt - pe).max()))
        gains.append(float(A @ opt - A @ pe))
    worst = max(errs)
    ok = worst < LEMMA31_OPTIMUM_TOL
    form = "KL(pi_old||pi) <= eps (Eq. 2 as stated)" if constraint == "stated" else "KL(pi||pi_old) <= eps (proof)"
    summ = (
        f"{n_instances} random instances (K=3..5, eta=1), constraint {form}: max |pi_opt - pi_old e^(A/eta)/Z| = "
        f"{worst:.1e}; objective gain of the true optimum over the claimed one up to {max(gains):.1e} "
        + ("(the claimed optimum solves it)" if ok else "(the claimed optimum does not solve this problem)")
    )
    gap_key = "max_optimum_error" if constraint == "proof" else "max_optimum_gap"
    return result(ok, summ, {gap_key: worst, "max_objective_gain": max(gains), "n_instances": n_instances})


def check_grpo_optimum(kl_weight: sp.Expr | None = None, K: int = 3) -> CheckResult:
    """LAD §4.1: with a KL(pi||pi_old) penalty of weight beta = eta (Fig. 1: both 1), GRPO's optimum
    coincides with LAD's ``pi_old e^{A/eta}``. Exact (K symbolic outcomes): the unclipped GRPO
    objective ``E_pi[A] - beta E_pi[k3]`` with GRPO's k3 estimator ``pi_old/pi - 1 - log(pi_old/pi)``
    has ``E_pi[k3] = KL(pi||pi_old)``, so it is Lemma 3.1's objective and its stationary point on the
    simplex is ``pi_old e^{A/beta}``; it equals LAD's iff ``beta = eta``. ``kl_weight`` (default eta)
    is the weight tried. (The clipped surrogate has a clipped trust region instead: lad.fig1.bandit.)"""
    eta = sp.Symbol("eta", positive=True)
    beta = eta if kl_weight is None else kl_weight
    po, _ = simplex("po", K)
    ps = list(sp.symbols(f"p1:{K + 1}", positive=True))
    A = list(sp.symbols(f"A1:{K + 1}", real=True))
    k3_mean = sum(ps[i] * (po[i] / ps[i] - 1 - sp.log(po[i] / ps[i])) for i in range(K))
    kl = sum(ps[i] * sp.log(ps[i] / po[i]) for i in range(K))
    # E_pi[k3] - KL(pi||pi_old) = sum pi_old - sum pi: zero on the simplex, so E_pi[k3] = KL(pi||pi_old) exactly
    k3_ok = is_zero(sp.expand(k3_mean - kl) - (sum(po) - sum(ps)))
    un = [po[i] * sp.exp(A[i] / eta) for i in range(K)]
    pi = [u / sum(un) for u in un]
    grad = [A[i] - beta * (sp.log(pi[i] / po[i]) + 1) for i in range(K)]
    stationary = all(is_zero(grad[i] - grad[0]) for i in range(1, K))
    ok = k3_ok and stationary
    return result(
        ok,
        f"K={K} symbolic: E_pi[k3] - KL(pi||pi_old) = sum pi_old - sum pi (0 on the simplex): {k3_ok}; unclipped "
        f"GRPO objective E_pi[A] - {beta} KL(pi||pi_old) stationary at LAD's optimum pi_old e^(A/eta)/Z: {stationary}",
        {"k3_mean_is_kl": k3_ok, "stationary_at_lad_optimum": stationary},
    )


def _mpmath_printer():
    """lambdify's mpmath printer without sorting the terms of each sum (``order="none"``): sorting the
    large gradient expressions was most of the cost of printing them; the evaluated function is the same
    expression (its sums are added in another order, which moves the result by 30-digit rounding only)."""
    from sympy.printing.pycode import MpmathPrinter

    return MpmathPrinter(
        {"fully_qualified_modules": False, "inline": True, "allow_unknown_functions": True, "order": "none"}
    )


#: ``lad.eq9.gradient`` / ``lad.b4.theoretical_gradient``: symbolic gradient vs the printed form at 30 digits.
EQ9_GRAD_TOL = 1e-12


def check_eq9_gradients(form: str = "eq9", seed: int = 0, n_points: int = 3) -> CheckResult:
    """LAD eq. (9) and App. B.4: the gradients with respect to the logits theta (K = 3, eta = 1).

    ``eq9``: ``grad L_LAD = E_{y~pi_theta} f'(rho e^{-A/eta}) grad log pi_theta(y)`` (eq. 8 summed exactly
    over y under pi_old). ``B4``: ``grad L_thm = E_{y~P_pi} f'(rho e^{-A/eta} Z_A/Z_pi) (grad log pi(y) -
    E_{y'~P_pi} grad log pi(y'))`` with ``P_pi = rho/Z_pi``, ``Z_pi = sum_y rho``, ``Z_A = sum_y e^{A/eta}``.
    Symbolic derivatives of the losses compared with the printed forms at ``n_points`` random rational
    points per f (|difference| < :data:`EQ9_GRAD_TOL` at 30 digits); ``eq9_no_expectation`` (f' without the pi_theta
    weight) is a wrong variant."""
    import random

    if form not in ("eq9", "eq9_no_expectation", "B4"):
        raise ValueError(f"form must be 'eq9', 'eq9_no_expectation' or 'B4', got {form!r}")
    rng = random.Random(seed)
    th = list(sp.symbols("t1:4", real=True))
    po = list(sp.symbols("o1:4", positive=True))
    a = list(sp.symbols("a1:4", real=True))
    Z = sum(sp.exp(v) for v in th)
    pi = [sp.exp(v) / Z for v in th]
    rho = [pi[i] / po[i] for i in range(3)]
    dlog = [[sp.diff(sp.log(pi[i]), v) for v in th] for i in range(3)]
    worst = 0.0
    for f in F_DIVERGENCES.values():
        fp = lambda u, f=f: sp.diff(f(x), x).subs(x, u)
        if form in ("eq9", "eq9_no_expectation"):
            loss = sum(po[i] * sp.exp(a[i]) * f(rho[i] * sp.exp(-a[i])) for i in range(3))
            w = [pi[i] if form == "eq9" else 1 for i in range(3)]
            printed = [sum(w[i] * fp(rho[i] * sp.exp(-a[i])) * dlog[i][j] for i in range(3)) for j in range(3)]
        else:
            ZA = sum(sp.exp(v) for v in a)
            Zp = sum(rho)
            P = [r / Zp for r in rho]
            loss = sum(sp.exp(a[i]) / ZA * f(P[i] * ZA / sp.exp(a[i])) for i in range(3))
            mean = [sum(P[i] * dlog[i][j] for i in range(3)) for j in range(3)]
            printed = [
                sum(P[i] * fp(rho[i] * sp.exp(-a[i]) * ZA / Zp) * (dlog[i][j] - mean[j]) for i in range(3))
                for j in range(3)
            ]
        diffs = sp.lambdify(
            [*th, *po, *a],
            [sp.diff(loss, v) - printed[j] for j, v in enumerate(th)],
            "mpmath",
            printer=_mpmath_printer(),
        )
        for _ in range(n_points):
            o = [mpmath.mpf(rng.randint(1, 9)) for _ in range(3)]
            o = [v / sum(o) for v in o]
            args = [mpmath.mpf(rng.randint(-9, 9)) / 5 for _ in range(3)] + o
            args += [mpmath.mpf(rng.randint(-9, 9)) / 7 for _ in range(3)]
            with mpmath.workdps(30):
                worst = max(worst, max(abs(float(d)) for d in diffs(*args)))
    ok = worst < EQ9_GRAD_TOL
    return result(
        ok,
        f"{form}: max |symbolic gradient - printed form| over the six f x {n_points} random points = {worst:.1e}",
        {"max_abs_diff": worst},
    )


# ----------------------------------------------------------------------------- Lemma 3.2
def _strictly_convex(f: Callable) -> bool | None:
    f2 = sp.simplify(sp.diff(f(x), x, 2))
    if f2.has(sp.Abs) or f2.has(sp.sign) or f2.has(sp.DiracDelta):
        f2 = sp.simplify(f2.subs(sp.DiracDelta(x - 1), 0))
    return f2.is_positive


def check_lemma32(
    div: str | Callable = "kl", ratio: str = "const", normalized_g: bool = False, K: int = 3
) -> CheckResult:
    """LAD Lemma 3.2 (App. B.2): for ``L = sum_y g2 f(p/g1)`` with ``g2/g1 = Z_g`` independent
    of y, every minimizer over the simplex satisfies ``p ∝ g1``.

    For ``div`` (a Table-5 name or a callable f): (1) strict convexity ``f'' > 0`` on x > 0
    (sympy sign decision); (2) exact stationarity at ``p* = g1/sum g1`` (K symbolic outcomes,
    symbolic g1, Z_g): ``dL/dp_y = Z_g f'(p*_y/g1_y)`` is y-independent. (1)+(2) prove the
    lemma for that f. If f is not strictly convex, the conclusion is tested on an exact
    two-outcome instance (g1 = (3/5, 4/5), so sum g1 = 7/5 as in the practical loss where
    g1 = pi_old e^{A/eta}; ``normalized_g=True`` uses g1 = (3/7, 4/7)) by a dense grid
    over p (numeric, labelled): all minimizers must be p*. ``ratio="y_dependent"`` breaks
    the hypothesis (g2 = g1 (1 + y)).
    """
    f = _f_of(div)
    name = div if isinstance(div, str) else getattr(div, "__name__", "f")
    g1 = list(sp.symbols(f"g1:{K + 1}", positive=True))
    Zg = sp.Symbol("Z_g", positive=True)
    g2 = [Zg * g1[i] * (1 if ratio == "const" else (1 + i)) for i in range(K)]
    S = sum(g1)
    u = sp.Symbol("u", positive=True)
    fp = sp.diff(f(u), u)
    strict = _strictly_convex(f)
    stationary = None
    if not f(u).has(sp.Abs):
        grads = [g2[i] / g1[i] * fp.subs(u, (g1[i] / S) / g1[i]) for i in range(K)]
        stationary = all(is_zero(grads[i] - grads[0]) for i in range(1, K))
    # exact two-outcome instance + grid (numeric)
    gg = [sp.Rational(3, 7), sp.Rational(4, 7)] if normalized_g else [sp.Rational(3, 5), sp.Rational(4, 5)]
    g2n = [2 * gg[i] * (1 if ratio == "const" else (1 + i)) for i in range(2)]
    pp = sp.Symbol("p", positive=True)
    Lp = g2n[0] * f(pp / gg[0]) + g2n[1] * f((1 - pp) / gg[1])
    Lf = sp.lambdify(pp, Lp, "numpy")
    grid = np.linspace(1e-6, 1 - 1e-6, 40001)
    vals = np.asarray(Lf(grid), dtype=float)
    vmin = float(np.nanmin(vals))
    pstar = float(gg[0] / sum(gg))
    tol = 1e-12 * max(1.0, abs(vmin))  # float64 evaluation of O(1) losses
    argmins = grid[vals <= vmin + tol]
    spread = float(argmins.max() - argmins.min())
    grid_ok = spread < 1e-4 and abs(float(np.median(argmins)) - pstar) < 1e-4  # grid step 2.5e-5
    if strict is True and stationary:
        ok = True
        how = "proved: f''>0 and exact stationarity at p*=g1/sum g1"
    else:
        ok = bool(grid_ok and stationary is not False)
        how = (
            f"f strictly convex: {strict}; stationarity at p*: {stationary}; grid over p (numeric): minimizers span "
            f"[{argmins.min():.4f}, {argmins.max():.4f}] vs p* = {pstar:.4f}"
        )
    summ = f"{name}: {how}" + (
        ""
        if ok
        else f"; grid minimizers span [{argmins.min():.4f}, {argmins.max():.4f}], p* = {pstar:.4f} -> not every minimizer is ∝ g1"
    )
    if name == "tv" and not ok and not normalized_g:
        summ += (
            f" (exact: L = sum|p-g| >= sum g - 1 = {float(sum(gg)) - 1:.2f}, attained by every p <= g; e.g. p=(1/2,1/2) and "
            f"p*=(3/7,4/7) both give {float(Lp.subs(pp, sp.Rational(1, 2))):.4f}/{float(Lp.subs(pp, sp.Rational(3, 7))):.4f}; "
            "TV is not strictly convex)"
        )
    return result(
        ok,
        summ,
        {
            "strict": bool(strict),
            "stationary": bool(stationary),
            "argmin_lo": float(argmins.min()),
            "argmin_hi": float(argmins.max()),
            "p_star": pstar,
        },
    )


# ----------------------------------------------------------------------------- Table 5
def check_table5(div: str, printed: Callable | None = None) -> CheckResult:
    """LAD Table 5: derive ``e^{a} f(rho e^{-a})`` from the row's f and compare with the row's
    printed loss (``TABLE5_PRINTED``, or ``printed`` to test another transcription).

    Verdicts: identical -> VERIFIED; differs by a theta-independent additive term or a
    positive constant factor (same minimizer, gradient equal or rescaled) -> PARTLY;
    otherwise the target ``pi* ∝ pi_old e^{a}`` is tested as a stationary point of the
    printed loss on an exact two-outcome instance -> REFUTED if it is not (exact
    expression, decided at 30 digits).
    """
    f = _f_of(div)
    printed = printed or TABLE5_PRINTED[div]
    pt, po = sp.symbols("pt po", positive=True)
    a = sp.Symbol("a", real=True)
    derived = sp.exp(a) * f(pt / po * sp.exp(-a))
    pr = printed(pt, po, a)
    diff = pr - derived
    if is_zero(diff):
        return CheckResult(
            Verdict.VERIFIED, f"{div}: printed loss == e^(A/eta) f(rho e^(-A/eta)) identically", {"identical": True}
        )
    if is_zero(sp.diff(diff, pt)):
        extra = sp.simplify(sp.expand_log(diff, force=True))
        return CheckResult(
            Verdict.PARTLY,
            f"{div}: printed loss = derived + ({extra}), a theta-independent term: same gradient and "
            "minimizer, but not the f-divergence value (not 0 at the optimum)",
            {"identical": False, "additive": str(extra)},
        )
    ratio = sp.simplify(pr / derived)
    if not ratio.free_symbols and ratio.is_positive:
        return CheckResult(
            Verdict.PARTLY,
            f"{div}: printed loss = {ratio} x derived (the table drops a constant factor of f): "
            f"same minimizer, gradient scaled by {ratio}",
            {"identical": False, "factor": float(ratio)},
        )
    # optimum test, exact two-outcome instance
    pold = [sp.Rational(1, 2), sp.Rational(1, 2)]
    av = [sp.Integer(1), sp.Rational(-1, 2)]
    Zp = sum(pold[i] * sp.exp(av[i]) for i in range(2))
    pst = [pold[i] * sp.exp(av[i]) / Zp for i in range(2)]

    def stationarity_gap(fun):
        g = [pold[i] * sp.diff(fun(pt, po, a), pt).subs({pt: pst[i], po: pold[i], a: av[i]}) for i in range(2)]
        return sp.N(g[0] - g[1], 30)

    gap_printed = stationarity_gap(printed)
    gap_derived = stationarity_gap(lambda p_, o_, a_: sp.exp(a_) * f(p_ / o_ * sp.exp(-a_)))
    from scipy.optimize import minimize_scalar

    pp = sp.Symbol("p", positive=True)
    Lp = sum(pold[i] * printed(v, pold[i], av[i]) for i, v in enumerate([pp, 1 - pp]))
    Lf = sp.lambdify(pp, Lp, "math")
    res = minimize_scalar(Lf, bounds=(1e-9, 1 - 1e-9), method="bounded", options={"xatol": 1e-10})
    moved = abs(gap_printed) > 1e-20 and abs(gap_derived) < 1e-20  # 30-digit evaluation of exact expressions
    summ = (
        f"{div}: printed loss is NOT e^(a) f(rho e^(-a)) up to constants; at pi_old=(1/2,1/2), A/eta=(1,-1/2) the target "
        f"pi*(y1)={float(pst[0]):.4f} is {'NOT ' if moved else ''}stationary for the printed loss (gradient gap {float(gap_printed):.3g}; "
        f"derived loss gap {float(gap_derived):.1g}); printed loss minimized at pi(y1)={res.x:.4f}"
    )
    return CheckResult(
        Verdict.REFUTED if moved else Verdict.PARTLY,
        summ,
        {
            "identical": False,
            "stationarity_gap": float(gap_printed),
            "printed_argmin": float(res.x),
            "target": float(pst[0]),
        },
    )


# ----------------------------------------------------------------------------- Theorem B.1
_PO = [sp.Rational(1, 2), sp.Rational(1, 3), sp.Rational(1, 6)]
_ALPHA = [sp.Integer(1), sp.Integer(-2), sp.Integer(3)]  # E_{pi_old}[alpha] = 1/3 != 0
_D = [sp.Integer(1), sp.Integer(1), sp.Integer(-5)]  # E_{pi_old}[d] = 0, so pi_theta stays normalized


# truncated power series in t, degree <= 2, exact rational coefficients: [c0, c1, c2]
def _ts_mul(p, q):
    return [p[0] * q[0], p[0] * q[1] + p[1] * q[0], p[0] * q[2] + p[1] * q[1] + p[2] * q[0]]


def _ts_inv(p):
    a0, a1, a2 = p
    return [1 / a0, -a1 / a0**2, (a1**2 - a0 * a2) / a0**3]


def _ts_exp_linear(c):  # exp(c t)
    return [sp.Integer(1), c, c**2 / 2]


def _ts_add(*ps):
    return [sum(p[i] for p in ps) for i in range(3)]


def _ts_scale(k, p):
    return [k * c for c in p]


def _gap_coefficients(f: Callable, g: sp.Expr, h: sp.Expr, centered: bool, ratio_form: str = "ratio") -> list[sp.Expr]:
    """Taylor coefficients (orders 0, 1, 2) in t of L_thm - L_LAD with a = t g alpha,
    rho = 1 + t h d (exact rationals), by exact truncated-power-series arithmetic.

    f enters through its Taylor coefficients at 1 (sympy: f(1), f'(1), f''(1)/2), composed with
    the argument series 1 + z1 t + z2 t^2: f = f0 + f1 z + (f2/2) z^2 + O(t^3). For f = k|x-1|
    the sign of the leading term of z (t > 0) is used instead: f = k sign(z) z, exact for small t.
    """
    Ea = sum(p * al for p, al in zip(_PO, _ALPHA))
    alpha = [al - Ea for al in _ALPHA] if centered else _ALPHA
    ea = [_ts_exp_linear(g * al) for al in alpha]
    ema = [_ts_exp_linear(-g * al) for al in alpha]
    rho = [[sp.Integer(1), h * d, sp.Integer(0)] for d in _D]
    ZA = _ts_add(*ea)
    Zp = _ts_add(*rho)
    ratio = _ts_mul(ZA, _ts_inv(Zp))
    inv_ZA = _ts_inv(ZA)
    args_lad = [_ts_mul(rho[i], ema[i]) for i in range(3)]
    args_thm = [_ts_mul(args_lad[i], ratio) for i in range(3)]
    if ratio_form == "prob":  # deliberately wrong practical loss: pi_theta instead of pi_theta/pi_old inside f
        args_lad = [_ts_scale(_PO[i], args_lad[i]) for i in range(3)]
    elif ratio_form != "ratio":
        raise ValueError(ratio_form)
    u = sp.Symbol("u", positive=True)
    if f(u).has(sp.Abs):
        k = f(u).subs(u, 2)

        def fe(arg):
            z = [arg[0] - 1, arg[1], arg[2]]
            lead = next((c for c in z if c != 0), sp.Integer(0))
            return _ts_scale(k * sp.sign(lead), z)
    else:
        fu = f(u)
        d1, d2 = sp.diff(fu, u), sp.diff(fu, u, 2)

        def fe(arg):
            x0, z1, z2 = arg  # x0 == 1 for the paper's losses (t = 0: no update, A = 0)
            f0, f1, f2 = (sp.simplify(e.subs(u, x0)) for e in (fu, d1, d2 / 2))
            return [f0, f1 * z1, f1 * z2 + f2 * z1**2]

    L_lad = _ts_add(*[_ts_scale(_PO[i], _ts_mul(ea[i], fe(args_lad[i]))) for i in range(3)])
    L_thm = _ts_add(*[_ts_mul(_ts_mul(ea[i], inv_ZA), fe(args_thm[i])) for i in range(3)])
    return [sp.nsimplify(sp.simplify(L_thm[n] - L_lad[n])) for n in range(3)]


def _order(coefs: list[sp.Expr]) -> int:
    for n, cn in enumerate(coefs):
        if cn != 0:
            return n
    return len(coefs)


def check_thmB1(div: str | Callable = "kl", ratio_form: str = "ratio") -> CheckResult:
    """LAD Theorem B.1: ``|L_thm - L_LAD| < O(gamma + delta)`` for ``|A| < gamma``,
    ``|pi/pi_old - 1| < delta``.

    Exact Taylor expansion in a common scale t (A/eta = t g alpha, rho = 1 + t h d, with exact
    rational pi_old, alpha, d; K = 3) of the gap, in four regimes: joint with uncentered
    advantages (E_{pi_old}[A] != 0), joint with centered advantages (a true advantage has
    E_{pi_old}[A] = 0), delta only (A = 0), gamma only (pi = pi_old). VERIFIED iff the order
    is >= 1 in every regime (the O(gamma+delta) bound); the summary reports the orders and
    f'(1), to confirm or refute "first order iff f'(1) != 0". For TV, |.| is replaced by
    sign * (.) with the sign of its leading Taylor term (exact for small t > 0). The
    ``ratio_form="prob"`` (pi_theta instead of pi_theta/pi_old inside f) is a wrong practical
    loss whose gap is O(1). The first-order coefficient is also checked against the closed form f'(1) E_{pi_old}[A/eta]
    (L_LAD's linear part is exactly f'(1)(1 - E_{pi_old}[e^{A/eta}]), L_thm has none).
    """
    f = _f_of(div)
    name = div if isinstance(div, str) else "f"
    f0 = sp.simplify(f(sp.Integer(1)))
    regimes = {
        "joint": (1, 1, False),
        "joint_centered": (1, 1, True),
        "delta_only": (0, 1, False),
        "gamma_only": (1, 0, False),
    }
    orders = {}
    coefs = {}
    for key, (g, h, cen) in regimes.items():
        co = _gap_coefficients(f, sp.Integer(g), sp.Integer(h), cen, ratio_form)
        coefs[key] = co
        orders[key] = _order(co)
    u = sp.Symbol("u", positive=True)
    smooth = not f(u).has(sp.Abs)
    fp1 = sp.simplify(sp.diff(f(u), u).subs(u, 1)) if smooth else sp.nan
    first_ok = True
    if smooth and orders["joint"] >= 1:
        Ea = sum(p * al for p, al in zip(_PO, _ALPHA))
        first_ok = sp.simplify(coefs["joint"][1] - fp1 * Ea) == 0
    ok = all(o >= 1 for o in orders.values()) and first_ok
    hyp = (
        "n/a (non-differentiable at 1)"
        if not smooth
        else ("confirmed" if (orders["joint"] == 1) == (fp1 != 0) else "REFUTED")
    )
    summ = (
        f"{name}: f(1)={f0}, f'(1)={fp1}; order of |L_thm-L_LAD| in t: joint uncentered {orders['joint']}, joint centered "
        f"{orders['joint_centered']}, delta-only {orders['delta_only']}, gamma-only {orders['gamma_only']}; O(gamma+delta) "
        f"{'holds' if ok else 'FAILS'}; 'first order iff f\\'(1)!=0' (uncentered A): {hyp}"
        + (f"; first-order coef = f'(1) E_pi_old[A/eta] = {coefs['joint'][1]}" if smooth else "")
    )
    nums = {f"order_{k}": v for k, v in orders.items()}
    nums["fprime1"] = str(fp1)
    return result(ok, summ, nums)


# ----------------------------------------------------------------------------- App. B.5
def _flowrl_f(u):
    return u * sp.log(u) ** 2


def check_B5_flowrl(f: Callable | None = None) -> CheckResult:
    """LAD App. B.5 (the form of docs/math.md §4): with ``f(x) = x (log x)^2``,
    ``pi_old e^{a} f(rho e^{-a}) = pi_theta (log(pi_theta/pi_old) - a)^2`` term by term, i.e.
    ``L_LAD = E_{pi_theta}[(log pi_theta/pi_old - A/eta)^2]``: on-policy TB with log Z = 0,
    reference pi_old and reward A/eta — exactly, for every eta (no eta -> inf needed).
    Also decides: f(1) = 0 and ``{x > 0 : f''(x) > 0} = (1/e, inf)``.
    """
    f = f or _flowrl_f
    pt, po = sp.symbols("pt po", positive=True)
    a = sp.Symbol("a", real=True)
    ident = is_zero(po * sp.exp(a) * f(pt / po * sp.exp(-a)) - pt * (sp.log(pt / po) - a) ** 2)
    f1 = sp.simplify(f(sp.Integer(1))) == 0
    region = sp.solve_univariate_inequality(sp.diff(f(x), x, 2) > 0, x, relational=False)
    region_ok = region == sp.Interval.open(sp.exp(-1), sp.oo)
    ok = ident and f1 and region_ok
    summ = (
        f"term identity pi_old e^a f(rho e^-a) == pi_theta (log rho - a)^2: {ident} (exact, any eta); f(1)=0: {f1}; "
        f"convex region {{f''>0}} = {region}: {'(1/e, oo) as stated' if region_ok else 'NOT (1/e, oo)'}"
    )
    return result(ok, summ, {"identity": ident, "convex_region": str(region)})


def check_B5_eq18(
    paper_log_z: Callable[[sp.Expr, sp.Expr], sp.Expr] | None = None, f: Callable | None = None
) -> CheckResult:
    """LAD eq. 18: ``L = E_{pi_theta}[(log Z + log pi_theta/pi_old - A/eta)^2]`` with
    ``Z = Z_A/(e Z_pi)`` (paper, after eta -> inf).

    Derivation (exact, term by term): the THEOREM loss with f = x (log x)^2 equals
    ``E_{P_pi}[(log(Z_A/Z_pi) + log rho - a)^2]`` with P_pi = rho/Z_pi (not pi_theta), and the
    PRACTICAL loss equals the eq.-18 form with log Z = 0 under pi_theta. ``paper_log_z(Z_A,
    Z_pi)`` (default ``log(Z_A/(e Z_pi))``) is compared with both constants. VERIFIED if it
    equals one of them, PARTLY if a TB form holds with a different constant, REFUTED if no
    TB form holds for f.
    """
    f = f or _flowrl_f
    if paper_log_z is None:
        paper_log_z = lambda ZA, Zp: sp.log(ZA / (sp.E * Zp))
    rho, ZA, Zp = sp.symbols("rho Z_A Z_pi", positive=True)
    a = sp.Symbol("a", real=True)
    thm_term = sp.exp(a) / ZA * f(rho * sp.exp(-a) * ZA / Zp)
    thm_ok = is_zero(thm_term - rho / Zp * (sp.log(ZA / Zp) + sp.log(rho) - a) ** 2)
    pt, po = sp.symbols("pt po", positive=True)
    prac_ok = is_zero(po * sp.exp(a) * f(pt / po * sp.exp(-a)) - pt * (sp.log(pt / po) - a) ** 2)
    cand = paper_log_z(ZA, Zp)
    eq_thm = is_zero(cand - sp.log(ZA / Zp))
    eq_prac = is_zero(cand)
    if not (thm_ok or prac_ok):
        return CheckResult(
            Verdict.REFUTED,
            "no trajectory-balance form: neither loss equals E[(log Z + log rho - a)^2] for this f",
            {"thm_form": False, "practical_form": False},
        )
    ok = (thm_ok and eq_thm) or (prac_ok and eq_prac)
    off = sp.simplify(sp.expand_log(cand - sp.log(ZA / Zp), force=True))
    summ = (
        f"theorem loss == E_(P_pi)[(log(Z_A/Z_pi) + log rho - A/eta)^2] with P_pi = rho/Z_pi != pi_theta: {thm_ok}; practical loss == "
        f"E_(pi_theta)[(log rho - A/eta)^2] (log Z = 0, any eta): {prac_ok}; paper's log Z = log(Z_A/(e Z_pi)) differs from "
        f"log(Z_A/Z_pi) by {off} and from 0 -> eq. 18's constant (the 1/e) and its expectation under pi_theta are not derivable "
        "from either loss; the TB form itself holds exactly without eta -> inf"
    )
    return CheckResult(
        Verdict.VERIFIED if ok else Verdict.PARTLY,
        summ,
        {"thm_form": thm_ok, "practical_form": prac_ok, "paper_const_offset": str(off)},
    )
