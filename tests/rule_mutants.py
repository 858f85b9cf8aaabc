"""Rule mutants: for each rule the suite certifies from the constructor's and the native load's
examples (SPEC 1.1.2, 1.1.6, 1.12.2-1.12.7), an implementation correct in everything but that rule
(those of the signature, groups, names and the native state dict are source edits of the reference,
tests/rule_mutants_names.py; the step's, tests/rule_mutants_steps.py).

A *lenient* mutant lacks a refusal: it repairs what the rule refuses and goes on, as a backend
without the check does (``betas`` of three items truncated, a ``format_version`` it does not know
read as 1, an unknown state key dropped). A *strict* mutant refuses or mangles what the rule
accepts (a legacy checkpoint not packed, a one-element counter tensor refused, scratch keys kept).
Every mutant is the reference with its input rewritten before the reference sees it (constructor
arguments, or a deep copy of the checkpoint a load is given), or its result changed after: a
valid input passes through untouched, so each differs from the reference on its rule alone.

The DCP adapter's load rules (SPEC 3.1-3.7) have mutants of the same kinds, plus *wrong* ones
that restore differently: the reference's adapter with the dict a load hands it repaired first
(:data:`RESTORE`, proven by the hostile checkpoints; :data:`DCP_LOAD`), or with one function of
its restore swapped in a module clone (:data:`DCP_LOAD`, :data:`STAGING`). All are proven
in-process, under a gloo group of one; only the 2-rank layout refusals (:data:`LAYOUT`) run a
partial certification in a subprocess.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math

import torch

import gefen_reference as reference
import gefen_reference.dcp as reference_dcp
import gefen_reference.dcp.hyper_staging as reference_hyper_staging
import gefen_reference.dcp.layout as reference_layout_module
import gefen_reference.dcp.reblock as reference_reblock
import gefen_reference.dcp.restore as reference_restore
import gefen_reference.dcp.schema as reference_dcp_schema
import gefen_reference.dcp.state as reference_state
from gefen_conformance.implementations import registry
from gefen_conformance.implementations.contract import CPU_BIT_EXACT

from . import mutant_tools, rule_mutants_names, rule_mutants_steps
from .source_mutants import mutated_adapter

# ------------------------------------------------------------------------------ constructor


def _finite_or(value, default, *, low=0.0, high=math.inf):
    try:
        v = float(value)
    except (TypeError, ValueError, RuntimeError):
        return default
    return (
        value if (low <= v < high or (high == math.inf and v == math.inf)) and not math.isnan(v) else default
    )


def _kwargs(fix):
    def rewrite(params, kwargs):
        return params, fix(dict(kwargs))

    return rewrite


def _set(key, fix):
    return _kwargs(lambda kw: {**kw, key: fix(kw[key])} if key in kw else kw)


def _betas(kw):
    if "betas" not in kw:
        return kw
    b = tuple(kw["betas"])
    return {**kw, "betas": (tuple(b) + (0.9, 0.999)[len(b) :])[:2]}


def _beta_range(kw):
    if "betas" not in kw:
        return kw
    b1, b2 = kw["betas"]
    return {**kw, "betas": (_finite_or(b1, 0.9, high=1.0), _finite_or(b2, 0.999, high=1.0))}


def _lr(lr):
    if torch.is_tensor(lr) and lr.numel() != 1:
        return lr.reshape(-1)[:1].reshape(())
    return _finite_or(lr, 1e-3)


def _substrings(value):
    return tuple(str(s) for s in value)


def _params(fix):
    return lambda params, kwargs: (fix(params), kwargs)


def _no_bare_tensor(params):
    if torch.is_tensor(params):
        raise TypeError(f"params must be an iterable of Tensors or dicts, got {type(params).__name__}")
    return params


def _empty_gets_a_placeholder(params):
    params = list(params)
    return params or [torch.nn.Parameter(torch.zeros(0))]


def _later_tensors_grouped(params):
    params = list(params)
    if params and isinstance(params[0], dict):
        return [p if isinstance(p, dict) else {"params": [p]} for p in params]
    return params


def _one_group_per_tensor(params):
    params = list(params)
    if params and not isinstance(params[0], dict):
        return [{"params": [p]} for p in params]
    return params


def _non_tensors_dropped(params):
    params = list(params)
    if params and isinstance(params[0], dict):
        return params
    keep = [p for p in params if torch.is_tensor(p) or (isinstance(p, tuple) and torch.is_tensor(p[-1]))]
    return [p for p in keep if not isinstance(p, tuple) or len(p) != 2 or torch.is_tensor(p[1])]


def _tuples_cut_to_two(params):
    params = list(params)
    return [p[:2] if isinstance(p, tuple) and len(p) > 2 else p for p in params]


def _complex_as_real(params):
    params = list(params)
    return [
        torch.nn.Parameter(torch.zeros(p.shape, device=p.device))
        if torch.is_tensor(p) and p.is_complex()
        else p
        for p in params
    ]


def _duplicates_dropped(params):
    seen = set()
    out = []
    for item in list(params):
        if isinstance(item, dict):
            group = dict(item, params=[p for p in item["params"] if id(p) not in seen])
            seen.update(id(p) for p in item["params"])
            out.append(group)
        elif id(item) not in seen:
            seen.add(id(item))
            out.append(item)
    return out


def _groups_without_params_get_one(params):
    params = list(params)
    return [
        dict(p, params=[torch.nn.Parameter(torch.zeros(4))])
        if isinstance(p, dict) and "params" not in p
        else p
        for p in params
    ]


def _empty_groups_get_a_placeholder(params):
    params = list(params)
    return [
        dict(p, params=[torch.nn.Parameter(torch.zeros(0))]) if isinstance(p, dict) and not p["params"] else p
        for p in params
    ]


#: rule id -> (what the mutant does, how it rewrites ``(params, kwargs)``)
CONSTRUCTOR = {
    "1.1.2#1": ("deterministic taken by truthiness", _set("deterministic", bool)),
    "1.1.2#2": ("an invalid lr replaced by the default", _set("lr", _lr)),
    "1.1.2#3": ("betas cut or padded to two items", _kwargs(_betas)),
    "1.1.2#4": ("a beta out of range replaced by the default", _kwargs(_beta_range)),
    "1.1.2#5": ("an invalid weight decay replaced by 0", _set("weight_decay", lambda v: _finite_or(v, 0.0))),
    "1.1.2#6": (
        "an invalid eps replaced by 1e-8",
        _set("eps", lambda v: _finite_or(v, 1e-8, low=1e-45, high=1e38)),
    ),
    "1.1.2#7": ("a negative refresh period read as 0", _set("codebook_refresh_every", lambda v: max(v, 0))),
    "1.1.2#8": (
        "a refresh period accepted and ignored",
        _set("codebook_refresh_every", lambda v: 0 if v > 0 else v),
    ),
    "1.1.2#9": ("capturable accepted and ignored", _set("capturable", lambda v: False)),
    "1.1.2#10": ("stochastic rounding accepted and ignored", _set("stochastic_round", lambda v: False)),
    "1.1.2#11": ("period_one_substrings items taken by str()", _set("period_one_substrings", _substrings)),
    "1.1.6#1": ("a bare tensor refused, as torch's Optimizer does", _params(_no_bare_tensor)),
    "1.1.6#2": ("an empty list given a placeholder parameter", _params(_empty_gets_a_placeholder)),
    "1.1.6#3": ("a tensor after group dicts made its own group", _params(_later_tensors_grouped)),
    "1.1.6#4": ("a list of tensors split into one group each", _params(_one_group_per_tensor)),
    "1.1.6#5": ("elements that are not tensors dropped", _params(_non_tensors_dropped)),
    "1.1.6#6": ("a tuple cut to its first two items", _params(_tuples_cut_to_two)),
    "1.1.6#7": ("a complex parameter replaced by a real one", _params(_complex_as_real)),
    "1.1.6#8": ("a tensor given twice kept once", _params(_duplicates_dropped)),
    "1.1.6#9": ("a group without params given one", _params(_groups_without_params_get_one)),
    "1.1.6#10": ("an empty group given a placeholder parameter", _params(_empty_groups_get_a_placeholder)),
}


# ------------------------------------------------------------------------------ native loads

_META = "_gefen_checkpoint_metadata"


def _metadata(sd):
    return [g[_META] for g in sd["param_groups"] if _META in g]


def _each_metadata(fix):
    def rewrite(sd):
        for g in sd["param_groups"]:
            if _META in g:
                g[_META] = fix(dict(g[_META]))

    return rewrite


def _tag_as_bool(sd):
    if "gefen_deterministic" in sd:
        sd["gefen_deterministic"] = bool(sd["gefen_deterministic"])


def _metadata_everywhere_or_nowhere(sd):
    if 0 < len(_metadata(sd)) < len(sd["param_groups"]):
        for g in sd["param_groups"]:
            g.pop(_META, None)


def _groups_agree(sd):
    first = _metadata(sd)[0] if _metadata(sd) else None
    if first is not None:
        for g in sd["param_groups"]:
            g[_META] = dict(first)


def _top_from_metadata(sd):
    first = _metadata(sd)[0] if _metadata(sd) else {}
    for top, key in (("gefen_global_step", "global_step"), ("gefen_codebook", "codebook")):
        if top in sd and key in first:
            sd[top] = first[key]


def _live_deterministic(optimizer, sd):
    for key in ("gefen_deterministic",):
        if key in sd:
            sd[key] = optimizer.deterministic
    _each_metadata(lambda m: {**m, "deterministic": optimizer.deterministic} if "deterministic" in m else m)(
        sd
    )


def _codebook_invented(sd):
    if sd.get("gefen_codebook") is None and any("m_codebook" in e for e in sd["state"].values()):
        cb = torch.linspace(-1.0, 1.0, 256)
        sd["gefen_codebook"] = cb
        _each_metadata(lambda m: {**m, "codebook": cb.clone()})(sd)


def _params_repacked(optimizer, sd):
    saved = sd["param_groups"]
    sizes = [len(g["params"]) for g in optimizer.param_groups]
    if len(saved) != len(sizes) or [len(g["params"]) for g in saved] == sizes:
        return
    flat = [
        (p, n, s)
        for g in saved
        for p, n, s in zip(g["params"], g["param_names"], g["param_names_synthesized"])
    ]
    for g, size in zip(saved, sizes):
        taken, flat = flat[:size], flat[size:]
        g["params"], g["param_names"], g["param_names_synthesized"] = (list(x) for x in zip(*taken))


def _missing_hypers_from_live(optimizer, sd):
    for saved, live in zip(sd["param_groups"], optimizer.param_groups):
        for key in ("lr", "beta1", "beta2", "eps", "weight_decay"):
            saved.setdefault(key, live[key])


def _names_of_another_length_dropped(sd):
    for g in sd["param_groups"]:
        if "param_names" in g and len(g["param_names"]) != len(g["params"]):
            del g["param_names"]
            g.pop("param_names_synthesized", None)


def _counter(value):
    if torch.is_tensor(value):
        value = value.reshape(-1)[0].item()
    return abs(int(round(float(value))))


def _counters_coerced(sd):
    if "gefen_global_step" in sd:
        sd["gefen_global_step"] = _counter(sd["gefen_global_step"])
    _each_metadata(lambda m: {**m, "global_step": _counter(m["global_step"])} if "global_step" in m else m)(
        sd
    )
    for entry in sd["state"].values():
        for key in ("step", "vmean_step", "factored_step"):
            if key in entry:
                entry[key] = _counter(entry[key])


def _one_element_counters_refused(sd):
    for entry in sd["state"].values():
        for key in ("step", "vmean_step", "factored_step"):
            if torch.is_tensor(entry.get(key)) and entry[key].dim() == 1:
                raise ValueError(f"counter {key} must be a scalar")


def _period_from_indices(sd):
    for entry in sd["state"].values():
        if "automatic_period" in entry and "m_codebook" in entry:
            entry["automatic_period"] = int(entry["m_codebook"].shape[-1])


def _stateless_entries_cleared(sd):
    for entry in sd["state"].values():
        if "m_codebook" not in entry and "m_magnitude" not in entry:
            for key in [k for k in entry if k != "name"]:
                del entry[key]


def _momentum_repaired(optimizer, sd):
    sizes = [p.numel() for g in optimizer.param_groups for p in g["params"]]
    for pid, entry in sd["state"].items():
        if "m_codebook" not in entry:
            continue
        period = int(entry.get("automatic_period", 1))
        rows = sizes[int(pid)] // period
        entry["m_codebook"] = entry["m_codebook"].to(torch.uint8).reshape(rows, period)
        magnitude = entry.get("m_magnitude", torch.ones(rows, 1))
        entry["m_magnitude"] = torch.nan_to_num(magnitude.abs(), nan=1.0)
        entry["step"] = max(int(entry.get("step", 1)), 1)


def _second_moment_repaired(optimizer, sd):
    for entry in sd["state"].values():
        if "m_codebook" not in entry:
            continue
        rows = entry["m_codebook"].shape[0]
        vmean = entry.get("vmean", torch.zeros(rows, 1))
        entry["vmean"] = vmean.abs().reshape(rows, 1)
        if "vmean_step" in entry:
            entry["vmean_step"] = max(int(entry["vmean_step"]), 1)


def _vmean_without_step_refused(sd):
    for entry in sd["state"].values():
        if "vmean" in entry and "vmean_step" not in entry:
            raise ValueError("vmean without vmean_step")


def _unknown_keys_dropped(sd):
    known = {"name", "automatic_period", "step", "m_codebook", "m_magnitude", "vmean", "vmean_step"}
    known |= {"v_row", "v_col", "factored_step"}
    for entry in sd["state"].values():
        for key in [
            k for k in entry if k not in known and not k.startswith("_capt_") and k != "m_codebook_shape"
        ]:
            del entry[key]


def _codebook_repaired(sd):
    def fix(cb):
        if cb is None:
            return None
        cb = cb.float().reshape(-1)
        cb = torch.nn.functional.interpolate(cb.view(1, 1, -1), size=256, mode="linear").view(-1)
        cb, _ = torch.sort(cb)
        cb[0], cb[-1] = -1.0, 1.0
        return cb

    if sd.get("gefen_codebook") is not None:
        sd["gefen_codebook"] = fix(sd["gefen_codebook"])
    _each_metadata(lambda m: {**m, "codebook": fix(m.get("codebook"))})(sd)


def _group_hypers_repaired(sd):
    for g in sd["param_groups"]:
        g["lr"] = _lr(g["lr"]) if not torch.is_tensor(g["lr"]) else g["lr"]
        g["eps"] = _finite_or(g["eps"], 1e-8, low=1e-45, high=1e38)
        g["beta1"] = _finite_or(g["beta1"], 0.9, high=1.0)
        g["beta2"] = _finite_or(g["beta2"], 0.999, high=1.0)


def _legacy_first_hypers(optimizer, sd):
    saved = sd["param_groups"]
    if len(saved) == len(optimizer.param_groups) or any(len(g["params"]) != 1 for g in saved):
        return
    at = 0
    for live in optimizer.param_groups:
        first = saved[at]
        for g in saved[at : at + len(live["params"])]:
            for key in ("lr", "beta1", "beta2", "eps", "weight_decay"):
                g[key] = first[key]
        at += len(live["params"])


def _legacy_refused(optimizer, sd):
    if len(sd["param_groups"]) != len(optimizer.param_groups):
        raise ValueError("the checkpoint's groups do not match the optimizer's")


def _version_1(m):
    return {**m, "format_version": 1} if m.get("format_version") not in (1, 2) else m


def _version_2_refused(sd):
    if any(m.get("format_version") == 2 for m in _metadata(sd)):
        raise ValueError("unsupported checkpoint format_version 2")


def _global_step_absent_is_zero(sd):
    sd.setdefault("gefen_global_step", 0)


def _untagged_resets(optimizer, sd):
    if "gefen_deterministic" not in sd and not any("deterministic" in m for m in _metadata(sd)):
        optimizer.deterministic = False


def _bool_metadata_tag(m):
    return {**m, "deterministic": bool(m["deterministic"])} if "deterministic" in m else m


#: rule id -> [(lenient|strict, what the mutant does, rewrite(sd) or rewrite(optimizer, sd), before|after)]
NATIVE_LOAD = {
    "1.12.2#1": [("lenient", "a deterministic tag taken by truthiness", _tag_as_bool)],
    "1.12.2#2": [("lenient", "metadata on some groups ignored", _metadata_everywhere_or_nowhere)],
    "1.12.2#3": [
        ("lenient", "an unknown format version read as 1", _each_metadata(_version_1)),
        ("strict", "format version 2 refused", _version_2_refused),
    ],
    "1.12.2#4": [("lenient", "a metadata tag taken by truthiness", _each_metadata(_bool_metadata_tag))],
    "1.12.2#5": [("lenient", "group 0's metadata taken for every group", _groups_agree)],
    "1.12.2#6": [
        ("lenient", "the top level overridden by the metadata", _top_from_metadata),
        ("strict", "a global step absent at the top level read as 0", _global_step_absent_is_zero),
    ],
    "1.12.2#7": [
        ("lenient", "the live deterministic setting kept over the checkpoint's", _live_deterministic),
        ("strict", "an untagged checkpoint resets deterministic", _untagged_resets, "after"),
    ],
    "1.12.2#8": [("lenient", "a missing codebook replaced by an even one", _codebook_invented)],
    "1.12.3#2": [("lenient", "parameters re-split by the live group sizes", _params_repacked)],
    "1.12.3#3": [
        ("lenient", "a missing hyperparameter taken from the live group", _missing_hypers_from_live)
    ],
    "1.12.3#4": [("lenient", "param_names of another length ignored", _names_of_another_length_dropped)],
    "1.12.4#1": [
        ("lenient", "counters coerced to non-negative ints", _counters_coerced),
        ("strict", "one-element 1-D counter tensors refused", _one_element_counters_refused),
    ],
    "1.12.4#2": [("lenient", "the period taken from the indices' shape", _period_from_indices)],
    "1.12.4#3": [("lenient", "counters of a state without momentum dropped", _stateless_entries_cleared)],
    "1.12.4#4": [("lenient", "momentum reshaped, cast and clamped", _momentum_repaired)],
    "1.12.4#5": [
        ("lenient", "the second moment reshaped, clamped or zero-filled", _second_moment_repaired),
        ("strict", "vmean without vmean_step refused", _vmean_without_step_refused),
    ],
    "1.12.4#6": [
        ("lenient", "unknown state keys dropped", _unknown_keys_dropped),
        ("strict", "scratch keys kept in the live state", None, "keep-scratch"),
    ],
    "1.12.5": [("lenient", "the codebook cast, resized, sorted and pinned to -1 and 1", _codebook_repaired)],
    "1.12.6": [("lenient", "saved hyperparameters repaired instead of validated", _group_hypers_repaired)],
    "1.12.7": [
        ("lenient", "legacy groups packed with the first group's hyperparameters", _legacy_first_hypers),
        ("strict", "legacy checkpoints not packed", _legacy_refused),
    ],
}


def _takes_optimizer(fn) -> bool:
    return fn.__code__.co_argcount == 2


class _LoadMutant(reference.Gefen):
    rewrite = None
    when = "before"

    def load_state_dict(self, state_dict):
        if self.when == "keep-scratch":
            scratch = {
                pid: {k: v for k, v in e.items() if k.startswith("_capt_") or k == "m_codebook_shape"}
                for pid, e in state_dict["state"].items()
            }
            super().load_state_dict(state_dict)
            params = [p for g in self.param_groups for p in g["params"]]
            for pid, extra in scratch.items():
                self.state[params[int(pid)]].update(extra)
            return
        if self.when == "after":
            super().load_state_dict(state_dict)
            type(self).rewrite(self, state_dict)
            return
        state_dict = copy.deepcopy(state_dict)
        rewrite = type(self).rewrite
        rewrite(self, state_dict) if _takes_optimizer(rewrite) else rewrite(state_dict)
        super().load_state_dict(state_dict)

    def state_dict(self):
        sd = super().state_dict()
        if self.when == "keep-scratch":
            params = [p for g in self.param_groups for p in g["params"]]
            for i, p in enumerate(params):
                for k, v in self.state[p].items():
                    if k.startswith("_capt_") or k == "m_codebook_shape":
                        sd["state"][i][k] = v
        return sd


@dataclasses.dataclass(frozen=True)
class RuleMutant:
    rule: str
    kind: str  # lenient or strict (a refusal or an acceptance), or wrong (a step)
    what: str
    implementation: object
    n: int = 0  # the row among its rule's mutants of this kind

    @property
    def id(self) -> str:
        return f"{self.rule}-{self.kind}" + (f"-{self.n + 1}" if self.n else "")


def _implementation(name: str, make_optimizer, profile: str):
    base = registry.resolve("reference")
    capabilities = base.capabilities - ({CPU_BIT_EXACT} if profile == "tolerance" else set())
    return dataclasses.replace(base, name=name, make_optimizer=make_optimizer, capabilities=capabilities)


def _constructor_mutant(rewrite):
    def make_optimizer(params, **kwargs):
        params, kwargs = rewrite(params, kwargs)
        return reference.Gefen(params, **kwargs)

    return make_optimizer


def _load_mutant(rewrite, when):
    # read through the class (type(self).rewrite), a plain function stays unbound: rewrite(sd) or
    # rewrite(optimizer, sd)
    cls = type("LoadMutant", (_LoadMutant,), {"rewrite": rewrite, "when": when})

    def make_optimizer(params, **kwargs):
        return cls(params, **kwargs)

    return make_optimizer


@functools.cache
def mutants(profile: str) -> list:
    """Every rule mutant, declared in ``profile`` (``torch-exact`` or ``tolerance``)."""
    out = []
    for rule, (what, rewrite) in CONSTRUCTOR.items():
        kind = "strict" if rule in ("1.1.6#1", "1.1.6#4") else "lenient"
        impl = _implementation(f"rule-{rule}-{kind}", _constructor_mutant(rewrite), profile)
        out.append(RuleMutant(rule, kind, what, impl))
    for rule, entries in NATIVE_LOAD.items():
        for kind, what, rewrite, *when in entries:
            impl = _implementation(
                f"rule-{rule}-{kind}", _load_mutant(rewrite, (when or ["before"])[0]), profile
            )
            out.append(RuleMutant(rule, kind, what, impl))
    for rule, kind, n, what, make_optimizer in rule_mutants_names.make_optimizers():
        impl = _implementation(f"rule-{rule}-{kind}-{n}", make_optimizer, profile)
        out.append(RuleMutant(rule, kind, what, impl, n))
    for rule, kind, n, what, make_optimizer in rule_mutants_steps.make_optimizers():
        impl = _implementation(f"rule-{rule}-{kind}-{n}", make_optimizer, profile)
        out.append(RuleMutant(rule, kind, what, impl, n))
    for rule, (what, cls) in DECLARED.items():
        impl = _implementation(f"rule-{rule}-strict", functools.partial(_declared_optimizer, cls), profile)
        out.append(RuleMutant(rule, "strict", what, impl))
    for rule, rows in SAVE.items():
        for n, (kind, what, edits) in enumerate(rows):
            base = _implementation(
                f"rule-{rule}-{kind}-{n}", registry.resolve("reference").make_optimizer, profile
            )
            state, planner, writer = mutated_adapter(**edits)
            impl = dataclasses.replace(
                base,
                dcp_state=state,
                save_planner=planner,
                async_writer=writer,
            )
            same_kind = sum(k == kind for k, _, _ in rows[:n])
            out.append(RuleMutant(rule, kind, what, impl, same_kind))
    return out


# ------------------------------------------------------------------------------ DCP saves

_FLAT_SLOTS = """    return tuple(
        SlotRef(i, s.group_index, s.name, s.parameter)
        for i, s in enumerate(sorted(slots, key=lambda s: s.name))
    )"""

_FINITE_FIRST = """    indices = state["m_codebook"]
    if not bool(torch.isfinite(state["m_magnitude"].float()).all()):
        raise ValueError("Gefen optimizer state is non-finite (m_magnitude); refusing to write")
"""

_NEGATIVE_VMEAN_REFUSED = """    if bool((state["vmean"] < 0).any()):
        raise ValueError("Gefen second moment is negative; refusing to write")
    for label, tensor in ("""

#: rule id -> [(lenient|strict, what the adapter does, {module of gefen_reference.dcp: (old, new)})]:
#: the reference's DCP adapter with one source edit (tests/source_mutants.py), as an adapter author
#: who gets that rule wrong writes it; checked by the save examples
#: (:mod:`gefen_conformance.suite.save_rule_examples`) in a group of one.
SAVE = {
    "2.1.1": [
        (
            "strict",
            "group_count written before slot_count",
            {
                "state": (
                    """            "slot_count": schema.int64_scalar(len(slots)),
            "group_count": schema.int64_scalar(len(opt.param_groups)),""",
                    """            "group_count": schema.int64_scalar(len(opt.param_groups)),
            "slot_count": schema.int64_scalar(len(slots)),""",
                )
            },
        )
    ],
    "2.1.2": [
        ("strict", "slots numbered in name order", {"layout": ("    return tuple(slots)", _FLAT_SLOTS)}),
        ("strict", "slot numbers not zero-padded", {"schema": ("slot_{index:08d}", "slot_{index}")}),
    ],
    "2.1.3": [
        (
            "strict",
            "the deterministic flag written as a bool tensor",
            {
                "state": (
                    '"deterministic": schema.uint8_flag(optimizer_view.deterministic_of(opt)),',
                    '"deterministic": schema.uint8_flag(optimizer_view.deterministic_of(opt)).bool(),',
                )
            },
        )
    ],
    "2.1.4": [
        (
            "strict",
            "an identity's shape written as a tuple",
            {
                "schema": (
                    '"shape": [int(extent) for extent in global_shape],',
                    '"shape": tuple(int(extent) for extent in global_shape),',
                )
            },
        )
    ],
    "2.1.5": [
        (
            "strict",
            "a tensor hyperparameter written as its tensor",
            {
                "schema": (
                    "entry[key] = float(value)",
                    "entry[key] = group[key] if torch.is_tensor(group[key]) else float(value)",
                )
            },
        )
    ],
    "2.1.7": [
        (
            "strict",
            "the world size written too",
            {
                "state": (
                    '"group_count": schema.int64_scalar(len(opt.param_groups)),',
                    '"group_count": schema.int64_scalar(len(opt.param_groups)),\n'
                    '            "world_size": schema.int64_scalar(dist.get_world_size()),',
                )
            },
        )
    ],
    "2.2.1": [
        (
            "strict",
            "the momentum expanded when state_dict() runs",
            {
                "state": (
                    """placeholder.deferred(
                slot.parameter, momentum_build
            )""",
                    "momentum_build()",
                )
            },
        )
    ],
    "2.2.2#1": [
        (
            "strict",
            "DCP's hook builds a new tensor on every call",
            {
                "placeholder": (
                    "            self._kept = self._build()\n        return self._kept",
                    "            return self._build()\n        return self._kept",
                )
            },
        )
    ],
    "2.2.2#2": [
        (
            "strict",
            "the bounded path keeps what it built",
            {"placeholder": ("        built = self._build()", "        built = self._kept = self._build()")},
        )
    ],
    "2.2.3": [
        (
            "strict",
            "a same-device .to() returns the placeholder",
            {
                "placeholder": (
                    "(torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.cuda)",
                    "(torch.Tensor.cpu, torch.Tensor.cuda)",
                )
            },
        ),
        (
            "strict",
            "is_pinned() refused like any operator",
            {"placeholder": ("if func is torch.ops.aten.is_pinned.default:", "if False:")},
        ),
    ],
    "2.3.1": [
        (
            "lenient",
            "any subclass of the optimizer accepted",
            {
                "optimizer_view": (
                    "return cls is supported_class() or",
                    "return isinstance(optimizer, supported_class()) or",
                )
            },
        ),
        (
            "lenient",
            "no process group check at construction",
            {
                "state": (
                    "        _require_process_group()\n        self.optimizer = optimizer",
                    "        self.optimizer = optimizer",
                )
            },
        ),
    ],
    "2.3.2": [
        (
            "lenient",
            "the layout checked only by state_dict()",
            {"state": ("if dist.get_world_size() == 1:", "if dist.get_world_size() < 1:")},
        )
    ],
    "2.4.2": [
        (
            "lenient",
            "a slot without indices saved as fresh",
            {
                "compact": (
                    "if not any(key in state for key in STEPPED_MARKERS):",
                    'if "m_codebook" not in state:',
                )
            },
        ),
        (
            "lenient",
            "a bool counter read as an int",
            {
                "schema": (
                    "if type(value) not in (int, float) or",
                    "if not isinstance(value, (int, float)) or",
                )
            },
        ),
        (
            "strict",
            "an integral float counter refused",
            {"schema": ("if type(value) not in (int, float) or", "if type(value) is not int or")},
        ),
    ],
    "2.4.3": [
        (
            "lenient",
            "non-finite block values saved",
            {"compact": ("if not bool(torch.isfinite(tensor.float()).all()):", "if False:")},
        ),
        (
            "lenient",
            "the index dtype not checked",
            {"compact": ("if indices.dtype != torch.uint8:", "if False:")},
        ),
        (
            "lenient",
            "finiteness checked before the block geometry",
            {"compact": ('    indices = state["m_codebook"]\n', _FINITE_FIRST)},
        ),
    ],
    "2.4.4": [
        (
            "strict",
            "a negative second moment refused at save",
            {"compact": ("    for label, tensor in (", _NEGATIVE_VMEAN_REFUSED)},
        )
    ],
    "2.5.1": [
        (
            "lenient",
            "flatten_state_dict=False refused only as a keyword",
            {
                "planner": (
                    "if not self.flatten_state_dict:",
                    'if not kwargs.get("flatten_state_dict", True):',
                )
            },
        )
    ],
    "2.5.2": [
        (
            "strict",
            "the planner expands placeholders through DCP's caching hook",
            {"planner": ("if is_placeholder(entry):", "if False:")},
        )
    ],
    "2.6.2": [
        (
            "lenient",
            "the misuse error points at GefenSavePlanner",
            {
                "placeholder": (
                    '"optimizer\'s own state_dict()."',
                    '"optimizer\'s own state_dict(); to bound memory, GefenSavePlanner."',
                )
            },
        )
    ],
}


class _TensorGlobalStep(reference.Gefen):
    """Keeps its global step as a tensor, as a backend that counts on the device does."""

    gefen_state_layout = reference_dcp.STATE_LAYOUT

    @property
    def global_step(self):
        return self._global_step_tensor

    @global_step.setter
    def global_step(self, value):
        self._global_step_tensor = torch.as_tensor(value, dtype=torch.int64)


class _NoNameProvenance(reference.Gefen):
    """Rebuilds its groups without the names' provenance flags."""

    gefen_state_layout = reference_dcp.STATE_LAYOUT

    def __init__(self, params, **kwargs):
        super().__init__(params, **kwargs)
        for group in self.param_groups:
            group.pop("param_names_synthesized", None)


class _FlatMagnitudes(reference.Gefen):
    """Keeps each parameter's block magnitudes flat (``[nb]``) between steps."""

    gefen_state_layout = reference_dcp.STATE_LAYOUT

    def _magnitudes(self, shape):
        for state in self.state.values():
            if "m_magnitude" in state:
                state["m_magnitude"] = state["m_magnitude"].reshape(shape)

    def step(self, closure=None):
        self._magnitudes((-1, 1))
        loss = super().step(closure)
        self._magnitudes((-1,))
        return loss


class _KeptCodebook(reference.Gefen):
    """Keeps its own copy of the codebook it learned and steps with it, whatever was loaded since."""

    gefen_state_layout = reference_dcp.STATE_LAYOUT

    def step(self, closure=None):
        kept = getattr(self, "_kept_codebook", None)
        if kept is not None:
            self.codebook = kept
        loss = super().step(closure)
        self._kept_codebook = self.codebook
        return loss


def _declared_optimizer(cls, params, **kwargs):
    return cls(params, **kwargs)


#: rule id -> (what the class does, a class that declares the reference's state layout and breaks
#: that promise of SPEC 2.3.6, served by the reference's adapter)
DECLARED = {
    "2.3.6#1": ("the global step kept as a tensor", _TensorGlobalStep),
    "2.3.6#2": ("groups without param_names_synthesized", _NoNameProvenance),
    "2.3.6#3": ("block magnitudes kept flat between steps", _FlatMagnitudes),
    "2.3.6#4": ("the codebook learned first kept over a loaded one", _KeptCodebook),
}


# ------------------------------------------------------------------------------ DCP layouts

#: rule id -> the words of the reference's refusal (SPEC 2.4.1): the mutant saves where the
#: reference refuses with them, as an adapter without that check does.
LAYOUT = {
    "2.4.1#2": "factored_v_2d",
    "2.4.1#3": "sharded mode",
    "2.4.1#4": "stable param_names",
    "2.4.1#5": "synthesized",
    "2.4.1#6": "plain tensor",
    "2.4.1#7": "one-dimensional",
    "2.4.1#8": "canonical order",
    "2.4.1#10": "Shard(0) parameters",
    "2.4.1#11": "at least one parameter",
    "2.4.1#12": "unique across every group",
}


# ------------------------------------------------------------------------------ DCP restores


def _slots(sd):
    return sorted({k.split(".")[0] for k in sd if k.startswith("slot_")})


def _format_version_2(optimizer, sd):
    sd["format_version"] = torch.tensor(2)


def _slot_count_of_the_target(optimizer, sd):
    sd["slot_count"] = torch.tensor(sum(len(g["params"]) for g in optimizer.param_groups))


def _identities_of_the_target(optimizer, sd):
    for identity, group_index, name in (
        (identity, gi, n)
        for identity, (gi, n) in zip(
            sd["param_identities"],
            [(gi, n) for gi, g in enumerate(optimizer.param_groups) for n in g["param_names"]],
        )
    ):
        identity["name"], identity["group"] = name, group_index


def _deterministic_of_the_target(optimizer, sd):
    sd["deterministic"] = torch.tensor(int(bool(optimizer.deterministic)), dtype=torch.uint8)


def _flags_clamped(optimizer, sd):
    for slot in _slots(sd):
        flag = sd[f"{slot}.initialized"]
        sd[f"{slot}.initialized"] = torch.clamp(flag, max=1).to(flag.dtype)


def _dense_repaired(optimizer, sd):
    for slot in _slots(sd):
        for key in ("momentum", "second_moment"):
            t = sd[f"{slot}.{key}"]
            fixed = torch.nan_to_num(t.float(), nan=0.0, posinf=0.0, neginf=0.0)
            sd[f"{slot}.{key}"] = fixed.abs() if key == "second_moment" else fixed


def _counters_made_coherent(optimizer, sd):
    for slot in _slots(sd):
        if int(sd[f"{slot}.initialized"]) == 1:
            for key in ("step", "vmean_step"):
                if int(sd[f"{slot}.{key}"]) < 1:
                    sd[f"{slot}.{key}"] = torch.tensor(1)
        else:
            for key in ("step", "vmean_step"):
                sd[f"{slot}.{key}"] = torch.tensor(0)


def _hypers_of_the_target(optimizer, sd):
    for saved, live in zip(sd["param_group_hypers"], optimizer.param_groups):
        for key in ("lr", "beta1", "beta2", "eps", "weight_decay"):
            value = saved[key]
            number = float(value.item() if torch.is_tensor(value) else value)
            valid = {
                "lr": number >= 0,
                "beta1": 0 <= number < 1,
                "beta2": 0 <= number < 1,
                "eps": number > 0,
                "weight_decay": number >= 0,
            }[key]
            if not valid or not math.isfinite(number):
                live_value = live[key]
                saved[key] = float(live_value.item() if torch.is_tensor(live_value) else live_value)


#: rule id -> (what the restoring adapter does instead of refusing, its repair of the loaded dict)
RESTORE = {
    "3.3.2": ("any format version read as 2", _format_version_2),
    "3.3.3": ("the slot count taken from the target", _slot_count_of_the_target),
    "3.3.5": ("identities renamed to the target's", _identities_of_the_target),
    "3.3.7": ("the target's deterministic flag kept", _deterministic_of_the_target),
    "3.4.2": ("an initialized flag above 1 read as 1", _flags_clamped),
    "3.4.3": ("non-finite values zeroed, negative second moments made positive", _dense_repaired),
    "3.4.4": ("incoherent counters repaired", _counters_made_coherent),
    "3.5.1": ("invalid saved hyperparameters replaced by the target's", _hypers_of_the_target),
}


# ------------------------------------------------------------------------------ DCP loads in one process

_COUNTERS = ("format_version", "global_step", "deterministic", "slot_count", "group_count")


def _header_of_the_target(optimizer, sd):
    """Header entries the dict lacks taken from the target's own ``state_dict()``."""
    from gefen_reference.dcp import GefenDCPState

    missing = [k for k in reference_dcp_schema.HEADER_KEYS if k not in sd]
    if missing:
        own = GefenDCPState(optimizer).state_dict()
        sd.update({k: own[k] for k in missing})


def _group_count_of_the_target(optimizer, sd):
    if "group_count" in sd:
        sd["group_count"] = torch.tensor(len(optimizer.param_groups))


def _hypers_per_live_group(optimizer, sd):
    """One saved hyperparameter entry per live group: cut, or padded with the live group's values."""
    if not isinstance(sd.get("param_group_hypers"), list):
        return
    saved = list(sd["param_group_hypers"])[: len(optimizer.param_groups)]
    for group in optimizer.param_groups[len(saved) :]:
        saved.append({k: float(group[k]) for k in reference_dcp_schema.HYPER_KEYS})
    sd["param_group_hypers"] = saved


def _all_counters(sd):
    return [k for k in sd if k in _COUNTERS or k.endswith((".initialized", ".step", ".vmean_step"))]


def _counters_coerced_to_ints(optimizer, sd):
    for key in _all_counters(sd):
        sd[key] = _counter(sd[key])


def _only_scalar_tensor_counters(optimizer, sd):
    """Counters read as DCP hands them over (0-dim tensors); any other form refused."""
    for key in _all_counters(sd):
        if not (torch.is_tensor(sd[key]) and sd[key].dim() == 0):
            raise ValueError(f"Gefen DCP counter {key} must be a scalar tensor, got {sd[key]!r}")


def _missing_slot_entries_backfilled(optimizer, sd):
    """A slot's missing counters taken from its other counter (as a native load backfills
    ``vmean_step`` from ``step``), missing dense entries read as zeros."""
    from gefen_reference.dcp import layout as reference_layout

    for slot in reference_layout.collect_slots(optimizer):
        key = functools.partial(reference_dcp_schema.slot_key, slot.index)
        counters = {f: sd[key(f)] for f in ("step", "vmean_step") if key(f) in sd}
        for field in ("step", "vmean_step"):
            sd.setdefault(key(field), next(iter(counters.values()), torch.tensor(0)))
        sd.setdefault(key("initialized"), torch.tensor(int(int(sd[key("step")]) > 0), dtype=torch.uint8))
        local = reference_layout.local_part(slot.parameter)
        for field in ("momentum", "second_moment"):
            sd.setdefault(key(field), torch.zeros(local.shape))


def _hypers_in_fp32(optimizer, sd):
    """Saved hyperparameters kept as fp32 values."""
    for entry in sd.get("param_group_hypers", []):
        for k in reference_dcp_schema.HYPER_KEYS:
            entry[k] = float(torch.tensor(float(entry[k]), dtype=torch.float32))


def _slots_before_the_header(optimizer, state_dict):
    """Every slot read before the header is checked (SPEC 3.2.2 orders the header first)."""
    slots = reference_layout_module.collect_slots(optimizer)
    for slot in slots:
        reference_restore._read_slot(state_dict, slot)
    return reference_restore.stage(optimizer, state_dict)


def _plain_tensors_refused(value):
    """Dense entries read only as the placeholders ``state_dict()`` handed out, or DTensors."""
    from torch.distributed.tensor import DTensor

    from gefen_reference.dcp import placeholder as reference_placeholder

    if reference_placeholder.is_placeholder(value) or isinstance(value, DTensor):
        return reference_restore.dense_value(value)
    if torch.is_tensor(value):
        raise ValueError(f"expected a placeholder or a DTensor, got a plain {type(value).__name__}")
    return reference_restore.dense_value(value)


def _fresh_slots_keep_counters(optimizer, readings):
    new_state, codebook = reference_restore._compact_state(optimizer, readings)
    for r in readings:
        if not r.materialized:
            new_state[r.slot.parameter].update(step=r.step, vmean_step=r.vmean_step)
    return new_state, codebook


def _counters_restarted(optimizer, readings):
    """Bias correction restarted after the re-quantization: a restored slot's counters set to 1."""
    new_state, codebook = reference_restore._compact_state(optimizer, readings)
    for state in new_state.values():
        if "step" in state:
            state.update(step=1, vmean_step=1)
    return new_state, codebook


def _every_non_empty_slot_materialized():
    @dataclasses.dataclass(frozen=True)
    class SlotReading(reference_restore.SlotReading):
        @property
        def materialized(self) -> bool:
            return self.momentum.numel() > 0

    return SlotReading


def _non_leaf_staged_as_detached(destination, saved_value, *, key):
    """An autograd intermediate staged as its detached value: the commit fills it under no_grad."""
    if torch.is_tensor(destination) and destination.requires_grad and not destination.is_leaf:
        staged = reference_hyper_staging.stage_hyperparameter(destination.detach(), saved_value, key=key)
        return dataclasses.replace(staged, destination=destination)
    return reference_hyper_staging.stage_hyperparameter(destination, saved_value, key=key)


def _filled_under_no_grad_only(group, staged):
    """Every tensor destination filled under no_grad, an inference tensor too (which raises)."""
    if not staged.in_place:
        group[staged.key] = staged.value
        return
    with torch.no_grad():
        staged.destination.fill_(staged.value)


def _storage_of(tensor):
    """A tensor's whole storage as where its value lives: views of other elements alias too."""
    return (str(tensor.device), tensor.untyped_storage().data_ptr())


def _reblocked_with_float64_means(codebook, momentum, second, period):
    """The reference's re-blocking, each block's mean second moment formed in float64 and rounded to
    fp32 once: finer than the reference's fp32 mean, so within every tolerance, and not its bits."""
    indices, magnitude, _ = reference_reblock.reblock(codebook, momentum, second, period)
    vmean = second.detach().double().reshape(-1).view(-1, period).mean(dim=1, keepdim=True).float()
    return indices, magnitude, vmean


def _restore_with(**overrides):
    return mutant_tools.clone(
        reference_state, restore=mutant_tools.clone(reference_restore, **overrides)
    ).GefenDCPState


def _dcp_state_of(adapter_class):
    return lambda rule: lambda base, optimizer: adapter_class(optimizer)


def _repairing(repair):
    return lambda rule: (
        lambda base, optimizer: _AdapterWithoutACheck(base.dcp_state(optimizer), optimizer, repair=repair)
    )


def _fresh_buffer_per_fetch():
    from gefen_reference.dcp import placeholder as reference_placeholder

    class FreshBufferPerFetch(reference_placeholder._DeferredDenseShard):
        """DCP's destination built anew on every fetch: a load copies into a temporary."""

        def __get_tensor_shard__(self, index):
            return self._build()

    return mutant_tools.clone(
        reference_state,
        placeholder=mutant_tools.clone(reference_placeholder, _DeferredDenseShard=FreshBufferPerFetch),
    ).GefenDCPState


#: rule id -> [(lenient|strict|wrong, what the adapter does, its adapter(base, optimizer))]: each
#: the reference's adapter wrong in that rule alone, failed by an example of
#: :data:`gefen_conformance.suite.dcp_load_examples.DCP_LOAD` (``tests/test_rule_mutants.py``).
DCP_LOAD = {
    "3.1.2": [("wrong", "DCP's copy lands in a temporary: the restore keeps the live dense state", None)],
    "3.1.3": [("strict", "plain tensors of the local shard refused", None)],
    "3.2.2": [("lenient", "every slot read before the header is checked", None)],
    "3.3.1": [("lenient", "missing header entries taken from the target", _header_of_the_target)],
    "3.3.4": [("lenient", "the group count taken from the target", _group_count_of_the_target)],
    "3.3.6": [("lenient", "hyperparameter entries cut or padded to the live groups", _hypers_per_live_group)],
    "3.3.8": [
        ("lenient", "counters coerced to nonnegative ints", _counters_coerced_to_ints),
        ("strict", "counters other than 0-dim tensors refused", _only_scalar_tensor_counters),
    ],
    "3.4.1": [("lenient", "missing slot entries backfilled", _missing_slot_entries_backfilled)],
    "3.4.5": [("wrong", "a fresh slot keeps its counters in its state", None)],
    "3.5.3": [
        ("lenient", "a non-leaf destination that requires grad filled under no_grad", None),
        ("wrong", "an inference-tensor destination filled outside inference mode", None),
    ],
    "3.5.4": [
        ("lenient", "destinations alias only when they are one tensor object", None),
        ("strict", "destinations alias when they share storage", None),
    ],
    "3.6.1": [("wrong", "fresh slots re-blocked as all-zero state", None)],
    "3.6.5": [("wrong", "restored counters restart at 1", None)],
    "3.7.1": [("wrong", "saved hyperparameters restored as fp32 values", _hypers_in_fp32)],
    "3.8.2": [("wrong", "each block's mean second moment formed in float64, then rounded", None)],
}


def _dcp_load_adapter(rule: str, kind: str, repair):
    """``dcp_state(base, optimizer)`` of the mutant of ``rule``: a repair before the reference's
    load, or a cloned adapter."""
    if repair is not None:
        return _repairing(repair)(rule)
    adapter = {
        "3.1.2": _fresh_buffer_per_fetch,
        "3.1.3": lambda: _restore_with(dense_value=_plain_tensors_refused),
        "3.2.2": lambda: (
            mutant_tools.clone(
                reference_state, restore=mutant_tools.proxy(reference_restore, stage=_slots_before_the_header)
            ).GefenDCPState
        ),
        "3.4.5": lambda: _restore_with(_compact_state=_fresh_slots_keep_counters),
        "3.5.3": lambda: {
            "lenient": _staging_with(stage_hyperparameter=_non_leaf_staged_as_detached),
            "wrong": _staging_with(apply=_filled_under_no_grad_only),
        }[kind],
        "3.5.4": lambda: {
            "lenient": _staging_with(_memory_of=lambda tensor: ("object", id(tensor))),
            "strict": _staging_with(_memory_of=_storage_of),
        }[kind],
        "3.6.1": lambda: _restore_with(SlotReading=_every_non_empty_slot_materialized()),
        "3.6.5": lambda: _restore_with(_compact_state=_counters_restarted),
        "3.8.2": lambda: _restore_with(
            reblock=mutant_tools.proxy(reference_reblock, reblock=_reblocked_with_float64_means)
        ),
    }[rule]()
    return _dcp_state_of(adapter)(rule)


@functools.cache
def dcp_load_mutants(profile: str) -> list:
    """Every DCP load rule mutant (:data:`DCP_LOAD`), declared in ``profile``."""
    out = []
    for rule, entries in DCP_LOAD.items():
        for kind, what, repair in entries:
            base = _implementation(
                f"dcp-load-{rule}-{kind}", registry.resolve("reference").make_optimizer, profile
            )
            make = _dcp_load_adapter(rule, kind, repair)
            impl = dataclasses.replace(base, dcp_state=functools.partial(make, base))
            out.append(RuleMutant(rule, kind, what, impl))
    return out


# ------------------------------------------------------------------------------ hyperparameter staging


def _filled_without_no_grad(group, staged):
    """Every fill run as it comes: outside ``no_grad`` and inference mode."""
    if not staged.in_place:
        group[staged.key] = staged.value
        return
    staged.destination.fill_(staged.value)


def _every_destination_replaced(group, staged):
    """Every destination replaced by the saved value as a Python float, tensors included."""
    group[staged.key] = staged.value


def _staging_with(**overrides):
    staging = mutant_tools.clone(reference_hyper_staging, **overrides)
    return _restore_with(hyper_staging=staging)


#: rule id -> (what the adapter does, its adapter class, the suite test that names the rule and runs
#: the explicit examples the proof runs: ``LIMITS`` or ``OPEN_LIMITS`` of
#: :mod:`gefen_conformance.suite.staging_examples`)
STAGING = {
    "3.5.3": (
        "a destination filled outside no_grad (a leaf that requires grad raises during the commit)",
        lambda: _staging_with(apply=_filled_without_no_grad),
        "test_staging_matches_reference_with_autograd_and_aliased_destinations",
    ),
    "3.5.4": (
        "aliased destinations not checked: the last fill wins",
        lambda: _staging_with(check_aliases=lambda staged_groups: None),
        "test_staging_matches_reference_with_autograd_and_aliased_destinations",
    ),
    "3.5.5": (
        "a tensor destination replaced by a Python float instead of filled in place",
        lambda: _staging_with(apply=_every_destination_replaced),
        "test_staging_matches_reference",
    ),
}


def staging_mutant(rule: str, profile: str):
    """The implementation whose adapter is wrong in the staging rule ``rule`` (:data:`STAGING`)."""
    base = _implementation(f"staging-{rule}", registry.resolve("reference").make_optimizer, profile)
    adapter = STAGING[rule][1]()
    return dataclasses.replace(base, dcp_state=adapter)


# ------------------------------------------------------------------------------ DCP loads on two ranks


class _CommitWithoutAgreement(reference_state.GefenDCPState):
    """Every rank compares its layout with the others' first, then stages and commits on its own:
    a rank that fails raises its own error, and the others commit what they staged."""

    def load_state_dict(self, state_dict):
        from gefen_reference.dcp import agreement

        slots = reference_layout_module.collect_slots(self.optimizer)
        agreement.require_identical_layouts(
            [slot.identity() for slot in slots], agreement.DIVERGENT_LAYOUT_LOAD_MESSAGE
        )
        plan = reference_restore.stage(self.optimizer, state_dict)
        self._slots = plan.slots
        reference_restore.commit(self.optimizer, plan)


#: rule id -> (what the adapter does, its adapter class): proven on two ranks by the case of
#: ``test_hostile_checkpoints.test_refused_on_every_rank`` that only rank 0 can see
#: (``nan-momentum``: the damaged row is rank 0's)
AGREEMENT = {"3.2.3": ("no agreement: a rank that staged commits", _CommitWithoutAgreement)}


def agreement_spec(rule: str, profile: str) -> str:
    """The ``--impl`` spec of the two-rank mutant of ``rule`` (:data:`AGREEMENT`) in ``profile``:
    each rank resolves it by this name."""
    return f"tests.rule_mutants:agreement_{rule.replace('.', '_')}_{profile.replace('-', '_')}"


def agreement_attempts(specs: list, path: str) -> list:
    """Rank body: ``hostile.load_attempt`` of ``path`` by each implementation in ``specs``, in turn."""
    from gefen_conformance.suite import hostile

    return [hostile.load_attempt(registry.resolve(spec), path) for spec in specs]


def _agreement_mutant(rule: str, profile: str):
    base = _implementation(f"agreement-{rule}", registry.resolve("reference").make_optimizer, profile)
    return dataclasses.replace(base, dcp_state=AGREEMENT[rule][1])


for _rule in AGREEMENT:
    for _profile in ("torch-exact", "tolerance"):
        globals()[agreement_spec(_rule, _profile).partition(":")[2]] = _agreement_mutant(_rule, _profile)


# ------------------------------------------------------------------------------ DCP adapter mutants


class _AdapterWithoutACheck:
    """The reference's DCP adapter without one check: a save that its layout check naming
    ``refused_with`` refuses returns an empty state instead (every rank has the same layout, so
    every rank does the same), or the dict a load hands it is first repaired by ``repair`` where
    one rule of SPEC 3.3-3.5 would refuse it."""

    def __init__(self, adapter, optimizer, *, refused_with: str | None = None, repair=None):
        self._adapter, self._optimizer = adapter, optimizer
        self._refused_with, self._repair = refused_with, repair

    def state_dict(self):
        try:
            return self._adapter.state_dict()
        except RuntimeError as exc:
            if self._refused_with is not None and self._refused_with in str(exc):
                return {}
            raise

    def load_state_dict(self, state_dict):
        if self._repair is not None:
            self._repair(self._optimizer, state_dict)
        return self._adapter.load_state_dict(state_dict)

    def __getattr__(self, name):
        return getattr(self._adapter, name)


#: kind -> (its rules, the suite tests that name them, how the adapter leaves the rule's check out):
#: the 2-rank layout refusals, proven by a partial certification in a subprocess
ADAPTER_MUTANTS = {
    "layout": (LAYOUT, "test_dcp_layout_rules", lambda rule: {"refused_with": LAYOUT[rule]}),
}


def _adapter_mutant(kind: str, rule: str, profile: str):
    base = _implementation(f"{kind}-{rule}", registry.resolve("reference").make_optimizer, profile)
    left_out = ADAPTER_MUTANTS[kind][2](rule)
    return dataclasses.replace(
        base,
        dcp_state=lambda optimizer: _AdapterWithoutACheck(base.dcp_state(optimizer), optimizer, **left_out),
    )


def restore_mutant(rule: str, profile: str):
    """The adapter that repairs what ``rule`` refuses (:data:`RESTORE`), declared in ``profile``: the
    hostile cases of :mod:`gefen_conformance.suite.hostile` that break ``rule`` prove it in-process."""
    base = _implementation(f"restore-{rule}", registry.resolve("reference").make_optimizer, profile)
    repair = RESTORE[rule][1]
    return dataclasses.replace(
        base,
        dcp_state=lambda optimizer: _AdapterWithoutACheck(
            base.dcp_state(optimizer), optimizer, repair=repair
        ),
    )


def adapter_spec(kind: str, rule: str, profile: str) -> str:
    """The ``--impl`` spec of the ``kind`` adapter mutant of ``rule`` in ``profile``."""
    name = f"{kind}_{rule.replace('.', '_').replace('#', '_')}_{profile.replace('-', '_')}"
    return f"tests.rule_mutants:{name}"


for _kind, (_rules, _, _) in ADAPTER_MUTANTS.items():
    for _rule in _rules:
        for _profile in ("torch-exact", "tolerance"):
            globals()[adapter_spec(_kind, _rule, _profile).partition(":")[2]] = _adapter_mutant(
                _kind, _rule, _profile
            )


__all__ = [
    "ADAPTER_MUTANTS",
    "AGREEMENT",
    "CONSTRUCTOR",
    "DCP_LOAD",
    "DECLARED",
    "LAYOUT",
    "NATIVE_LOAD",
    "RESTORE",
    "STAGING",
    "RuleMutant",
    "SAVE",
    "adapter_spec",
    "agreement_attempts",
    "agreement_spec",
    "dcp_load_mutants",
    "mutants",
    "restore_mutant",
    "staging_mutant",
]
