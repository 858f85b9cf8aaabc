"""Rule mutants of the constructor's signature and options, groups, names, a tensor learning rate,
the native state dict and a native load's envelope, provenance and atomicity (SPEC 1.1-1.4, 1.11,
1.12): for each such rule the suite certifies from :mod:`gefen_conformance.suite.rule_examples`,
the reference with the one source edit (tests/source_mutants.py) that breaks that rule, as a
backend author gets it wrong: a keyword left out, a name de-duplicated, a group split, a tensor
``lr`` copied, a saved counter made a tensor, a check moved after the state it guards.

A row is ``rule: [(kind, what, {module: (old, new) or [(old, new), ...]}), ...]``: ``kind`` is
``strict`` for a mutant that builds, saves or loads differently what the rule accepts, ``lenient``
for one that lacks (or runs too late) a refusal the rule requires (tests/test_rule_mutants.py).
Every edit must apply exactly once to the reference's current source.
"""

from __future__ import annotations

from .source_mutants import mutated_gefen

_VALIDATED = (
    "        beta1, beta2 = split_betas(betas)\n"
    "        validate_hyperparameters(lr, beta1, beta2, eps, weight_decay)\n"
)
_DEFAULTS = "defaults = dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay)"
_GROUP_LR = 'lr = param_group.get("lr", d["lr"])'
_GROUP_VALIDATED = (
    "        validate_hyperparameters(lr, beta1, beta2, eps, weight_decay)\n\n"
    '        raw = param_group["params"]\n'
)
_REGISTERED = '        registered = {p for g in self.param_groups for p in g["params"]}\n'

#: SPEC 1.1: the signature, the order of the parameter list's checks, the options, after construction.
CONSTRUCTOR = {
    "1.1.1": [
        (
            "strict",
            "the verbose keyword not accepted",
            {"optimizer": ("        verbose: bool = False,\n", "")},
        ),
        ("strict", "betas defaulting to (0.9, 0.99)", {"optimizer": ("(0.9, 0.999),", "(0.9, 0.99),")}),
        (
            "strict",
            "factored_v_2d defaulting to False",
            {"optimizer": ("factored_v_2d: bool = True,", "factored_v_2d: bool = False,")},
        ),
        (
            "strict",
            "force_1d_period_one defaulting to True",
            {"optimizer": ("force_1d_period_one: bool = False,", "force_1d_period_one: bool = True,")},
        ),
    ],
    "1.1.2#12": [
        (
            "lenient",
            "the parameter list taken apart before the hyperparameters are validated",
            {
                "optimizer": [
                    (_VALIDATED, "        groups = self._as_groups(params)\n" + _VALIDATED),
                    (
                        "super().__init__(self._as_groups(params), defaults)",
                        "super().__init__(groups, defaults)",
                    ),
                ]
            },
        )
    ],
    "1.1.5": [
        ("strict", "fused stored in defaults", {"optimizer": (_DEFAULTS, _DEFAULTS[:-1] + ", fused=fused)")}),
        (
            "strict",
            "period_one_substrings matched as given, not lowercased",
            {"optimizer": ("tuple(s.lower() for s in substrings)", "substrings")},
        ),
    ],
    "1.1.7": [
        (
            "strict",
            "the betas pair kept in defaults beside beta1 and beta2",
            {"optimizer": (_DEFAULTS, _DEFAULTS.replace("lr=lr, ", "lr=lr, betas=betas, "))},
        )
    ],
}

#: SPEC 1.2: parameter groups.
GROUPS = {
    "1.2.1": [
        (
            "strict",
            "the implicit group's marker kept in the stored group",
            {
                "optimizer": (
                    '    "param_names_synthesized",\n    _IMPLICIT_GROUP,\n)',
                    '    "param_names_synthesized",\n)',
                )
            },
        )
    ],
    "1.2.2": [
        (
            "strict",
            "a group of several parameters split into one group per parameter",
            {
                "optimizer": (
                    "        if isinstance(items[0], dict):\n            return items\n",
                    "        if isinstance(items[0], dict):\n"
                    "            split = []\n"
                    "            for g in items:\n"
                    '                many = isinstance(g, dict) and isinstance(g.get("params"), list)\n'
                    '                split += [dict(g, params=[p]) for p in g["params"]] if many else [g]\n'
                    "            return split\n",
                )
            },
        )
    ],
    "1.2.3": [
        (
            "strict",
            "beta1 given beside betas taking precedence",
            {
                "optimizer": (
                    'if "betas" in param_group:',
                    'if "betas" in param_group and "beta1" not in param_group:',
                )
            },
        ),
        (
            "lenient",
            "a group's parameters inspected before its hyperparameters are validated",
            {
                "optimizer": [
                    (_GROUP_VALIDATED, '        raw = param_group["params"]\n'),
                    (
                        _REGISTERED,
                        "        validate_hyperparameters(lr, beta1, beta2, eps, weight_decay)\n"
                        + _REGISTERED,
                    ),
                ]
            },
        ),
    ],
    "1.2.5": [
        (
            "strict",
            "the caller's group name stored as given",
            {
                "optimizer": (
                    'group["name"] = str(param_group["name"]).lower()',
                    'group["name"] = param_group["name"]',
                )
            },
        ),
        (
            "strict",
            "a group of one parameter without a name left unnamed",
            {"optimizer": ('        elif len(names) == 1:\n            group["name"] = names[0]\n', "")},
        ),
    ],
    "1.2.6": [
        (
            "strict",
            "a parameter without requires_grad skipped by the step",
            {
                "optimizer": (
                    "                if p.grad is None:\n"
                    "                    continue\n"
                    "                grad = local_tensor(p.grad)",
                    "                if p.grad is None or not p.requires_grad:\n"
                    "                    continue\n"
                    "                grad = local_tensor(p.grad)",
                )
            },
        )
    ],
    "1.2.8": [
        (
            "strict",
            "a group without lr given a copy of the default's tensor",
            {
                "optimizer": (
                    _GROUP_LR,
                    _GROUP_LR
                    + '\n        lr = lr.clone() if torch.is_tensor(lr) and "lr" not in param_group else lr',
                )
            },
        )
    ],
}

#: SPEC 1.3: names and their provenance.
NAMES = {
    "1.3.1": [
        (
            "strict",
            "the state's name keeps the caller's spelling",
            {
                "optimizer": (
                    '        for p, name in zip(params, names):\n            self.state[p]["name"] = name\n',
                    "        for p, name, caller in zip(params, names, given):\n"
                    '            self.state[p]["name"] = name if caller is None else str(caller)\n',
                )
            },
        )
    ],
    "1.3.2": [
        (
            "strict",
            "caller names de-duplicated with suffixes",
            {
                "naming": (
                    "name, synthesized = str(caller_name).lower(), False",
                    "name, synthesized = unique_name(caller_name, taken), False",
                )
            },
        )
    ],
    "1.3.3": [
        (
            "strict",
            "names given earlier in the same group not taken",
            {"naming": ("        taken.add(name)\n", "")},
        ),
        (
            "strict",
            "the implicit group named like an explicit one",
            {"naming": ("elif implicit_group:", "elif False:")},
        ),
        (
            "strict",
            "a suffixed group name flagged as the caller's",
            {"naming": ("synthesized = name != base", "synthesized = False")},
        ),
    ],
    "1.3.4": [("strict", "suffixes counted from 2", {"naming": ("    k = 1\n", "    k = 2\n")})],
    "1.3.6": [
        (
            "strict",
            "the saved flag taken over the live one for an unchanged name",
            {
                "naming": (
                    "if i < len(live_names) and live_names[i] == name:",
                    "if not usable and i < len(live_names) and live_names[i] == name:",
                )
            },
        ),
        (
            "strict",
            "a renamed parameter without a usable saved flag keeps its live flag",
            {
                "naming": (
                    "            flags.append(True)\n",
                    "            flags.append(bool(live_flags[i]) if i < len(live_flags) else True)\n",
                )
            },
        ),
    ],
}

#: SPEC 1.4: a tensor learning rate.
TENSOR_LR = {
    "1.4.1": [
        (
            "strict",
            "a tensor lr stored as a 0-d view",
            {
                "optimizer": (
                    _GROUP_LR,
                    _GROUP_LR + "\n        lr = lr.reshape(()) if torch.is_tensor(lr) else lr",
                )
            },
        )
    ],
}

_PACKED_ENTRY = "{k: _compact(v) for k, v in entry.items() if k not in SCRATCH_KEYS}"

#: SPEC 1.11 and 1.12.10: the native state dict.
NATIVE_STATE = {
    "1.3.5": [
        (
            "strict",
            "entries holding only a name left out of state_dict()",
            {
                "native_state": (
                    "        if p in index_of\n",
                    '        if p in index_of and set(entry) != {"name"}\n',
                )
            },
        )
    ],
    "1.11.1": [
        (
            "strict",
            "the top-level global step saved as a tensor",
            {
                "native_state": (
                    '"gefen_global_step": optimizer.global_step,',
                    '"gefen_global_step": torch.tensor(optimizer.global_step),',
                )
            },
        )
    ],
    "1.11.3": [
        (
            "strict",
            "the momentum indices saved flat",
            {
                "native_state": (
                    _PACKED_ENTRY,
                    _PACKED_ENTRY.replace(
                        "_compact(v)", '_compact(v.reshape(-1) if k == "m_codebook" else v)'
                    ),
                )
            },
        )
    ],
    "1.11.4": [
        (
            "strict",
            "a never-stepped entry saved with step 0",
            {"native_state": (_PACKED_ENTRY, '{"step": 0, **' + _PACKED_ENTRY + "}")},
        )
    ],
    "1.11.6": [
        (
            "strict",
            "a parameter whose first gradient is zero prepared but not updated",
            {
                "optimizer": (
                    "                updates.append(",
                    "                if bool(grad.any()):\n                    updates.append(",
                )
            },
        )
    ],
    "1.12.10": [
        (
            "strict",
            "the momentum magnitudes saved through bf16",
            {
                "native_state": (
                    _PACKED_ENTRY,
                    _PACKED_ENTRY.replace(
                        "_compact(v)", '_compact(v.bfloat16().float() if k == "m_magnitude" else v)'
                    ),
                )
            },
        )
    ],
}

_PACKED = "    saved_groups = _pack_legacy_groups(saved_groups, optimizer.param_groups)\n"
_GROUP_COUNT = (
    "    if len(saved_groups) != len(optimizer.param_groups):\n"
    '        raise ValueError("loaded state dict has a different number of parameter groups")\n'
)

#: SPEC 1.12: a native load's envelope, its group mapping and its atomicity.
NATIVE_LOAD = {
    "1.12.1": [
        (
            "lenient",
            "a state dict without state or param_groups not checked (a KeyError, or no state)",
            {
                "native_state": (
                    "        raise ValueError(\"a native state dict needs 'state' and 'param_groups'\")\n",
                    "        pass\n",
                )
            },
        )
    ],
    "1.12.3#1": [
        (
            "strict",
            "the group count compared before legacy packing",
            {"native_state": (_PACKED + _GROUP_COUNT, _GROUP_COUNT + _PACKED)},
        )
    ],
    "1.12.9": [
        (
            "lenient",
            "a group's hyperparameters committed to the live group while staging",
            {
                "native_state": (
                    "        staged.param_groups.append(group)\n",
                    "        staged.param_groups.append(group)\n"
                    "        live.update({k: group[k] for k in HYPERPARAMETER_KEYS})\n",
                )
            },
        ),
        (
            "lenient",
            "scratch keys deleted from the caller's entries",
            {
                "native_state": (
                    "        entry = {}\n",
                    "        entry = {}\n"
                    "        for key in [k for k in saved_state.get(saved_id) or {} if k in DROPPED_KEYS]:\n"
                    "            del saved_state[saved_id][key]\n",
                )
            },
        ),
    ],
}

#: SPEC 1.12.11: a native load into DTensor parameters.
SHARDED_LOAD = {
    "1.12.11#1": [
        (
            "lenient",
            "a native state dict of DTensor parameters: this rank's shards written as the whole",
            {
                "optimizer": (
                    "        if any(is_dtensor(p) for _, _, p in self.named_params()):\n"
                    "            raise ValueError(\n",
                    "        if False:\n            raise ValueError(\n",
                )
            },
        ),
    ],
    "1.12.11#2": [
        (
            "lenient",
            "per-parameter state of a native checkpoint loaded into DTensor parameters",
            {
                "native_state": (
                    "        _refuse_tensor_state_for_dtensors(saved_state, codebook)\n",
                    "        pass\n",
                )
            },
        ),
        (
            "strict",
            "a never-stepped checkpoint refused for DTensor parameters",
            {"native_state": ("    if carried:\n", "    if True:\n")},
        ),
    ],
}

RULES = {**CONSTRUCTOR, **GROUPS, **NAMES, **TENSOR_LR, **NATIVE_STATE, **NATIVE_LOAD, **SHARDED_LOAD}


def make_optimizers() -> list:
    """``[(rule, kind, n, what, make_optimizer)]`` for every row of :data:`RULES` (``n``: its row
    among its rule's mutants of the same kind)."""
    out = []
    for rule, rows in RULES.items():
        seen: dict = {}
        for kind, what, edits in rows:
            n = seen[kind] = seen.get(kind, -1) + 1
            gefen = mutated_gefen(**edits)
            out.append((rule, kind, n, what, lambda params, _g=gefen, **kw: _g(params, **kw)))
    return out
