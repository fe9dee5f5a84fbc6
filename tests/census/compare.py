"""One family's census entry: build it tiny, swap posenc in, compare, and run the two controls.

The comparison: the logits of a 12-token prompt (batch 2) may differ from the model's own by at most
``RELATIVE * max(1, max |logit|)``, and greedy generation with the KV cache (4 new tokens) must give the same
tokens (a model without an LM head: its last hidden state, no generation). The controls, on the same model:

- **the harness's own check**: swapping in transformers' own module, rebuilt by posenc's swap
  (``_swap_rotary``) from the config it found (``type(module)(config=config)``, else a copy), must pass the
  comparison: the harness finds the modules, their configs and their places right;
- **a wrong swap is caught**: posenc's module built from a copy of the config whose rope base (``rope_theta``,
  in every layer type's parameters) is doubled must fail the comparison by at least ``CAUGHT`` times the bound.

Statuses: ``ok``; ``refused`` (posenc, or the swap, raised ValueError/TypeError/NotImplementedError with a
message); ``wrong`` (the swap was accepted and the model then crashes or its outputs differ); ``not_built`` (the
tiny model or its forward fails before any swap); ``unchecked`` (a control failed: the comparison cannot vouch
for this family).
"""

from __future__ import annotations

import copy
import signal
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

from posenc.conventions import hf
from tests.census import builder

RELATIVE = 2e-4
#: how many times the bound a doubled rope base must move the outputs by (a hybrid with one attention layer of
#: two, Qwen3-Next, moves them by 3.1 times; posenc's own swap stays below 0.05 times)
CAUGHT = 2
NEW_TOKENS = 4
#: seconds one family may take (build, swap, four forwards and generations)
LIMIT = 120
_REFUSALS = (ValueError, TypeError, NotImplementedError)
_POSENC = str(Path(__import__("posenc").__file__).parent)


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Timeout(f"over {LIMIT} s")


def _short(error: BaseException, limit: int = 400) -> str:
    text = f"{type(error).__name__}: {error}".replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _raised_by_posenc(error: BaseException) -> bool:
    """Whether the innermost frame of the traceback is posenc's (``swap_rotary``'s refusal, naming the module,
    re-raises posenc's own)."""
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and frames[-1].filename.startswith(_POSENC)


def _outputs(model: Any, given: dict[str, torch.Tensor]) -> dict[str, Any]:
    with torch.no_grad():
        out = model(**given)
        logits = getattr(out, "logits", None)
        if logits is None:
            logits = (
                out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
            )
        result = {"logits": logits.float()}
        if (
            hasattr(model, "generate")
            and getattr(model, "can_generate", lambda: False)()
        ):
            gen = model.generate(
                **given, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
                eos_token_id=None, output_logits=True, return_dict_in_generate=True,
            )  # fmt: skip
            result["tokens"] = gen.sequences[:, -NEW_TOKENS:]
            result["steps"] = [s.float() for s in gen.logits]
    return result


def _distance(ours: dict[str, Any], ref: dict[str, Any]) -> tuple[float, bool]:
    """(max |logit difference| over the prompt and every step / the bound, same tokens)."""
    ratio = (ours["logits"] - ref["logits"]).abs().max().item() / _bound(ref["logits"])
    for a, b in zip(ours.get("steps", []), ref.get("steps", [])):
        ratio = max(ratio, (a - b).abs().max().item() / _bound(b))
    same = "tokens" not in ref or torch.equal(ours["tokens"], ref["tokens"])
    return ratio, same


def _bound(logits: torch.Tensor) -> float:
    return RELATIVE * max(1.0, logits.abs().max().item())


def _own(module: Any, config: Any) -> Any:
    """transformers' own module, rebuilt from the config the swap found (a copy if it takes no config)."""
    try:
        return type(module)(config=config)
    except Exception:
        return copy.deepcopy(module)


def doubled_base(config: Any) -> Any:
    """A copy of ``config`` whose rope_theta is doubled, in its own and every sub-config's parameters (and as
    an attribute of its own, where a family reads it there: ESM)."""
    wrong = copy.deepcopy(config)
    for c in [wrong, *builder._sub_configs(wrong)]:
        if isinstance(vars(c).get("rope_theta"), (int, float)):
            c.rope_theta = 2 * c.rope_theta
        params = getattr(c, "rope_parameters", None)
        if not isinstance(params, dict):
            continue
        nested = [v for v in params.values() if isinstance(v, dict)]
        for p in nested if nested and "rope_theta" not in params else [params]:
            if isinstance(p.get("rope_theta"), (int, float)):
                p["rope_theta"] = 2 * p["rope_theta"]
    return wrong


def _variant(model: Any, make: Any) -> tuple[Any, dict[str, str]]:
    twin = copy.deepcopy(model)
    return twin, hf._swap_rotary(twin, make)


def check(family: str) -> dict[str, Any]:
    """The census entry of ``family``: status, message, timings and measurements."""
    import posenc

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    start = time.perf_counter()
    entry: dict[str, Any] = {"family": family}
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(LIMIT)
    try:
        entry.update(_check(family, posenc))
    except _Timeout as error:
        entry.update(
            status=entry.get("status", "not_built"), message=f"timed out: {error}"
        )
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    entry["seconds"] = round(time.perf_counter() - start, 2)
    return entry


def _per_module(model: Any) -> dict[str, Any]:
    """For a refused model: which of its rotary modules posenc accepts alone and which it refuses (what a
    swap of only the accepted ones would cover)."""
    accepted, refusing = [], []
    for name, module in model.named_modules():
        if not name or hf._not_replaceable(module) is not None:
            continue
        try:
            hf._posenc_rotary(module, hf._config_of(model, name, module))
            accepted.append(name)
        except Exception:
            refusing.append(name)
    return {"accepted_alone": accepted, "refusing": refusing}


def layers_that_rotate(
    model: Any, given: dict[str, torch.Tensor]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(rotating, present)``: the layer indices (an attention module's ``layer_idx``, else its ordinal) of the
    attention modules whose forward called the family's rotation function in one forward of ``model`` on
    ``given`` (a spy on the function, not posenc's reading of the code), and of all the family's attention modules
    the model holds (a hybrid's linear-attention or Mamba layers have none). ``posenc.conventions.rotated_layers``
    must name ``rotating`` among ``present``."""
    from posenc.conventions._hf_families import (
        family_of,
        rotation_functions,
        rotation_guards,
    )

    family = family_of(model.config)
    found = rotation_guards(family)
    if len(found) != 1:
        raise ValueError(f"{len(found)} attention classes rotate q and k")
    layers = [m for m in model.modules() if isinstance(m, found[0][0])]
    current, seen = [None], set()
    # the layer index the module was built with (Zamba2's shared blocks: -1, then its ordinal)
    indices = [
        m.layer_idx
        if isinstance(getattr(m, "layer_idx", None), int) and m.layer_idx >= 0
        else i
        for i, m in enumerate(layers)
    ]
    for index, layer in zip(indices, layers):
        layer.register_forward_pre_hook(lambda *_, i=index: current.__setitem__(0, i))
    originals = {f.__name__: f for f in rotation_functions(family)}

    def spy(original: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            seen.add(current[0])
            return original(*args, **kwargs)

        return call

    try:
        for name, original in originals.items():
            setattr(family.module, name, spy(original))
        with torch.no_grad():
            model(**given)
    finally:
        for name, original in originals.items():
            setattr(family.module, name, original)
    return tuple(sorted(seen)), tuple(sorted(set(indices)))


def _check(family: str, posenc: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        model = builder.tiny_model(family)
    except builder.NotBuilt as error:
        return {"status": "not_built", "message": str(error)}
    except Exception as error:
        return {"status": "not_built", "message": f"tiny model fails: {_short(error)}"}
    info: dict[str, Any] = {
        "model": type(model).__name__,
        "build_seconds": round(time.perf_counter() - t0, 2),
    }
    # the model's own outputs (a model that takes no tokens: none, and only the swap's refusal can be read)
    given, ref, no_input = None, None, ""
    try:
        given = builder.inputs(model)
        ref = _outputs(model, given)
    except builder.NotBuilt as error:
        no_input = str(error)
    except Exception as error:
        return {
            **info,
            "status": "not_built",
            "message": f"the tiny model's own forward fails: {_short(error)}",
        }
    # posenc's swap: a refusal is posenc's (or the swap's) own exception, raised before anything is replaced
    try:
        ours = copy.deepcopy(model)
        with warnings.catch_warnings(record=True) as kept:
            warnings.simplefilter("always")
            replaced = posenc.swap_rotary(ours)  # the one line under test
        info["kept"] = [
            str(w.message) for w in kept if "posenc.swap_rotary" in str(w.message)
        ]
    except _REFUSALS as error:
        if _raised_by_posenc(error) and str(error):
            return {
                **info,
                **_per_module(model),
                "status": "refused",
                "message": _short(error),
            }
        return {
            **info,
            "status": "wrong",
            "message": f"swap raised outside posenc: {_short(error)}",
        }
    except Exception as error:
        return {**info, "status": "wrong", "message": f"swap crashed: {_short(error)}"}
    info["replaced"] = [f"{n}: {cls}" for n, cls in replaced.items()]
    if ref is None:
        return {**info, "status": "not_built", "message": f"swap accepted; {no_input}"}
    calls = [0]
    for name in replaced:
        ours.get_submodule(name).register_forward_hook(
            lambda *args: calls.__setitem__(0, calls[0] + 1)
        )
    try:
        mine = _outputs(ours, given)
    except Exception as error:
        return {
            **info,
            "status": "wrong",
            "message": f"swapped model crashes: {_short(error)}",
        }
    ratio, same = _distance(mine, ref)
    info["error_over_bound"] = round(ratio, 4)
    info["calls"] = calls[0]
    # which layers rotate: posenc's reading of the family's code against a spy on its rotation function
    try:
        info["rotated_layers"] = list(posenc.conventions.rotated_layers(model.config))
    except ValueError as error:
        info["rotated_layers"] = f"refused: {_short(error)}"
    try:
        seen, present = layers_that_rotate(copy.deepcopy(model), given)
        info["layers_seen_rotating"], info["attention_layers"] = (
            list(seen),
            list(present),
        )
    except Exception as error:
        info["layers_seen_rotating"] = f"spy fails: {_short(error)}"
    # the controls
    try:
        own_ratio, own_same = _distance(_outputs(_variant(model, _own)[0], given), ref)
    except Exception as error:
        own_ratio, own_same = float("inf"), False
        info["own_error"] = _short(error)
    info["own_error_over_bound"] = own_ratio
    try:
        twin, _ = _variant(model, lambda m, c: hf._posenc_rotary(m, doubled_base(c)))
        caught, _ = _distance(_outputs(twin, given), ref)
    except Exception as error:  # a crash is caught too
        caught = float("inf")
        info["doubled_base_error"] = _short(error)
    info["doubled_base_over_bound"] = round(caught, 2)
    if ratio > 1 or not same:
        what = (
            f"logits differ by {ratio:.3g} times the bound"
            if ratio > 1
            else "greedy tokens differ"
        )
        return {**info, "status": "wrong", "message": what}
    if own_ratio > 1 or not own_same:
        what = f"transformers' own module, swapped in by the harness, differs ({own_ratio:.3g} x bound)"
        return {**info, "status": "unchecked", "message": what}
    if not calls[0]:
        return {
            **info,
            "status": "unchecked",
            "message": "the swapped modules are never called",
        }
    if caught < CAUGHT:
        return {**info, "status": "unchecked",
                "message": f"a doubled rope base moves the outputs by only {caught:.3g} times the bound"}  # fmt: skip
    return {**info, "status": "ok", "message": ""}
