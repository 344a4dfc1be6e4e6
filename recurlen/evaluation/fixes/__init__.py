"""Training-free fixes for length generalization, evaluated beside post-training (`recurlen eval fixes=[...]`).

    from recurlen.evaluation.fixes import FIXES, get
    fix = get("mambaextend"); record = fix.apply(model, fix.make_config({"steps": 20}), calibration=seqs, train_len=T)

Each is one class with one interface (recurlen.evaluation.fixes.base.Fix): the architectures it applies to come
from the registry (the timescale knobs an LM class offers, recurlen.models.timescales), others are refused by name.
"""

from __future__ import annotations

from recurlen.evaluation.fixes.base import Fix, FixRecord
from recurlen.evaluation.fixes.forget_more import ForgetMore
from recurlen.evaluation.fixes.scales import AScale, MambaExtend
from recurlen.evaluation.fixes.stuffed_mamba import StuffedMamba
from recurlen.evaluation.fixes.token_selection import LongMamba
from recurlen.util.arguments import suggest
from recurlen.util.errors import UserError

FIXES: dict[str, type[Fix]] = {f.name: f for f in (MambaExtend, AScale, ForgetMore, StuffedMamba, LongMamba)}


def get(name: str) -> Fix:
    if name not in FIXES:
        raise UserError(f"unknown fix {name!r}{suggest(name, FIXES)}; allowed: {list(FIXES)}")
    return FIXES[name]()


__all__ = ["FIXES", "Fix", "FixRecord", "get"]
