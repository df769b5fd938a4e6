"""Whose call a sync is: the user's frame (reported there), Lightning's, or dataset code's.

Attribution walks the Python stack from the call: frames inside torch, numpy, the standard
library and this tool are skipped. A few torch functions that sync on an input the
caller could have described (:data:`_TORCH_SYNCS`: nn.Transformer's causal-mask check) are kept
as the library too. Frames of any other installed library (torchmetrics,
Hugging Face, ...: a file under ``site-packages``) are passed over too, remembered as the
library the sync happened in: the sync is placed at the line that called into the library
(the user's, or Lightning's), never at a line in site-packages alone. If the first remaining
frame belongs to Lightning
(``pytorch_lightning/``, ``lightning_fabric/``, ``lightning_utilities/``, or the ``lightning``
package's ``lightning/pytorch/`` and ``lightning/fabric/``: both namespaces), the sync is the
framework's (``origin="framework"``), otherwise it is the user's and is reported at that
frame, so ``print(t)`` points at the ``print`` line. Calls made while a ``torch.utils.data``
loader is on the stack (dataset code run by the loader) are not counted.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import os
import re
import sysconfig
from collections.abc import Sequence
from types import FrameType
from typing import NamedTuple

import torch

from lightning_speedpack.sync_points.findings import FIXES, Origin, SyncFinding

__all__ = [
    "Attribution",
    "attribute",
    "attribute_frame",
    "framework_fix",
    "library_calls",
    "library_fix",
    "library_name",
    "matches_allow",
]


def _module_dir(name: str) -> str | None:
    """The folder of top-level package ``name`` (found without importing it), None if absent."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # absent, hidden by a meta-path finder, or half-imported
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(next(iter(spec.submodule_search_locations)), "")


def _dirs(names: Sequence[str]) -> tuple[str, ...]:
    return tuple(d for n in names if (d := _module_dir(n)) is not None)


_SKIP_DIRS = _dirs(["torch", "numpy"])
# The pack's own callbacks count as framework too: under DDP ThroughputLogger deliberately
# reads one small all-reduced tensor on logging steps, and a user should see that labelled as
# the pack's, with the setting that spaces it out, not mixed with their own syncs.
# Lightning's own files under either namespace: `pytorch_lightning/`, `lightning_fabric/` (the
# pytorch-lightning install) and `lightning/` (holding `lightning/pytorch/`, `lightning/fabric/`).
# Found by path without importing anything; a package that is not installed is left out.
_FRAMEWORK_DIRS = _dirs(
    [
        "pytorch_lightning",
        "lightning_fabric",
        "lightning_utilities",
        "lightning",
        "lightning_speedpack",
    ]
)
_DATA_DIR = os.path.join(os.path.dirname(torch.__file__), "utils", "data", "")
_STDLIB_DIR = os.path.join(sysconfig.get_paths()["stdlib"], "")
# This tool's own files (the wrappers, the detector, the callback) are never the caller.
_OWN_DIR = os.path.normcase(os.path.join(os.path.dirname(os.path.abspath(__file__)), ""))
_GENERIC_FRAMEWORK = ("apply_func.py", "lightning_utilities")

_TORCH_DIR = os.path.join(os.path.dirname(torch.__file__), "")
#: torch's own Python functions that sync on an input the caller could have described, whose
#: frame is kept as the library the sync happened in (any other torch frame is passed over).
_TORCH_SYNCS = frozenset({"_detect_is_causal_mask"})

_SKIP, _FRAMEWORK, _USER, _DATA, _LIBRARY = 0, 1, 2, 3, 4
_INSTALLED = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
_CATEGORY: dict[str, int] = {}


def _category(filename: str) -> int:
    cat = _CATEGORY.get(filename)
    if cat is not None:
        return cat
    if filename.startswith(_DATA_DIR):
        cat = _DATA
    elif filename.startswith(_SKIP_DIRS) or os.path.normcase(filename).startswith(_OWN_DIR):
        cat = _SKIP
    elif filename.startswith(_FRAMEWORK_DIRS):
        cat = _FRAMEWORK
    elif filename.startswith("<frozen") or (
        filename.startswith(_STDLIB_DIR)
        and "site-packages" not in filename
        and "dist-packages" not in filename
    ):
        cat = _SKIP
    elif any(marker in filename for marker in _INSTALLED):
        cat = _LIBRARY
    else:
        cat = _USER
    _CATEGORY[filename] = cat
    return cat


class Attribution(NamedTuple):
    """Where a sync is reported, whose it is, and the library frame it happened in (if any)."""

    frame: FrameType
    origin: Origin
    library: FrameType | None = None


def attribute(frame: FrameType | None) -> Attribution | None:
    """Return where a sync made at ``frame`` is reported, whose it is, and the library frame.

    Frames of torch, numpy, the standard library and this detector are skipped; frames of
    another installed library are passed over, the innermost kept as ``library``. If the
    first other frame is Lightning's, the origin is ``"framework"`` and the frame is the first
    Lightning frame that is not a generic helper (``apply_func``, ``lightning_utilities``).
    Otherwise it is ``"user"`` at that frame (at the library's own frame only when no frame
    outside the libraries called it). Returns None when a ``torch.utils.data`` loader is on
    the stack (dataset code), or for a stack with no frame left.
    """
    f = frame
    library: FrameType | None = None
    cat = _SKIP
    while f is not None:
        cat = _category(f.f_code.co_filename)
        if cat == _DATA:
            return None
        if cat == _LIBRARY or (cat == _SKIP and _torch_sync(f)):
            library = library or f
        elif cat != _SKIP:
            break
        f = f.f_back
    if f is None:
        if library is None:
            return None
        f, cat = library, _USER  # nothing outside the library called it
    found: FrameType = f
    origin: Origin = "user"
    if cat == _FRAMEWORK:
        origin = "framework"
        g: FrameType | None = f
        while g is not None and _category(g.f_code.co_filename) in (_FRAMEWORK, _SKIP):
            name = g.f_code.co_filename
            if _category(name) == _FRAMEWORK and not any(x in name for x in _GENERIC_FRAMEWORK):
                found = g
                break
            g = g.f_back
    up = found.f_back
    while up is not None:  # dataset code called by a DataLoader is not the training step's
        if _category(up.f_code.co_filename) == _DATA:
            return None
        up = up.f_back
    return Attribution(found, origin, None if library is found else library)


def _torch_sync(frame: FrameType) -> bool:
    code = frame.f_code
    return code.co_name in _TORCH_SYNCS and code.co_filename.startswith(_TORCH_DIR)


def attribute_frame(frame: FrameType | None) -> tuple[FrameType, Origin] | None:
    """:func:`attribute` without the library: ``(frame, origin)`` or None."""
    found = attribute(frame)
    return None if found is None else (found.frame, found.origin)


def library_name(filename: str) -> str:
    """The top-level package of an installed file (``torchmetrics`` for ``.../torchmetrics/x.py``).

    Example:
        >>> library_name("/venv/lib/python3.11/site-packages/torchmetrics/utilities/compute.py")
        'torchmetrics'
    """
    for marker in _INSTALLED:
        _head, sep, tail = filename.partition(marker)
        if sep:
            return tail.split(os.sep, 1)[0].removesuffix(".py")
    return os.path.basename(filename)


def _qualname(frame: FrameType) -> str:
    """``Class.method`` or ``function`` of a frame (Python 3.10: from ``self``'s class)."""
    name = getattr(frame.f_code, "co_qualname", None)
    if isinstance(name, str):
        return name
    owner = frame.f_locals.get("self")
    name = frame.f_code.co_name
    return name if owner is None else f"{type(owner).__name__}.{name}"


def library_calls(frame: FrameType | None) -> tuple[str, ...]:
    """The installed libraries' functions on the stack at ``frame``, outermost first.

    From ``frame`` (the innermost library frame, :attr:`Attribution.library`) outward to the
    first frame that is neither a library's nor skipped (the caller the sync is reported at):
    qualified names (``"GCNConv.forward"``, ``"gcn_norm"``, ``"add_remaining_self_loops"``).
    Functions defined inside others (a decorator's ``wrapper``) are left out.
    """
    names: list[str] = []
    f = frame
    while f is not None:
        cat = _category(f.f_code.co_filename)
        if (cat == _LIBRARY or _torch_sync(f)) and "<locals>" not in (name := _qualname(f)):
            names.append(name)
        elif cat != _SKIP:
            break
        f = f.f_back
    return tuple(reversed(names))


_PYG_POOL = re.compile(r"global_\w+_pool$")
_PYG_SELF_LOOPS = ("add_self_loops", "add_remaining_self_loops", "remove_self_loops")


def _pyg_fix(kind: str, location: str, calls: Sequence[str]) -> str:
    """PyTorch Geometric's own remedy for a sync inside ``torch_geometric``.

    Decided by the PyG functions on the stack (``calls``, outermost first) and the file the
    sync happened in (``location``, ``torch_geometric/utils/loop.py:650``).
    """
    names = [c.rsplit(".", 1)[-1] for c in calls]
    file = location.rsplit(":", 1)[0].replace(os.sep, "/").rsplit("/", 1)[-1]
    conv = next((c.split(".")[0] for c in calls if re.match(r"\w*Conv\.forward$", c)), None)
    inner = names[-1] if names else ""
    if "gcn_norm" in names:
        return (
            "PyG's GCNConv adds self loops and normalises the graph in every forward "
            "(gcn_norm -> add_remaining_self_loops masks the edges: a data-dependent size). "
            "The same graph every step (transductive): GCNConv(..., cached=True). Batches of "
            "graphs: do it once per graph in the dataset's transform, "
            "transform=torch_geometric.transforms.GCNNorm() with GCNConv(..., normalize=False) "
            "given batch.edge_weight, or transform=torch_geometric.transforms."
            "AddRemainingSelfLoops() with GCNConv(..., add_self_loops=False)"
        )
    loops = next((n for n in reversed(names) if n in _PYG_SELF_LOOPS), None)
    if conv is not None and (loops or file == "loop.py"):
        return (
            f"PyG's {conv} handles self loops in every forward ({loops or file} masks the "
            "edges, a data-dependent size): add them once per graph in the dataset's transform "
            "(transform=torch_geometric.transforms.AddRemainingSelfLoops()) and build "
            f"{conv}(..., add_self_loops=False)"
        )
    if loops is not None:
        transform = "".join(w.title() for w in loops.split("_"))
        return (
            f"PyG's {loops} masks the edges in every call (a data-dependent size): do it once "
            f"per graph in the dataset's transform (transform=torch_geometric.transforms."
            f"{transform}()) instead of in the step"
        )
    pool = next((n for n in names if _PYG_POOL.match(n)), None)
    if pool is not None:
        return (
            f"PyG's {pool} counts the graphs with batch.max() + 1 when not told "
            f"({inner or 'scatter'}, {kind}): pass the count, "
            f"{pool}(x, batch, size=batch.num_graphs) (or size= the number you know)"
        )
    if inner == "scatter" or file == "_scatter.py":
        return (
            f"PyG's scatter sizes its output with index.max() + 1 when not told ({kind}): "
            "pass dim_size= the count you know (batch.num_graphs, x.size(0))"
        )
    outer = names[0] if names else "this call"
    return (
        f"PyG syncs inside {outer} ({kind}), most often to find a size it was not given: "
        "pass the sizes you know explicitly (num_nodes=, dim_size=, size=: data.num_nodes, "
        "batch.num_graphs)"
    )


_HF_MASK_CHECKS = (
    "_prepare_4d_attention_mask_for_sdpa",
    "_prepare_4d_causal_attention_mask_for_sdpa",
    "_ignore_causal_mask_sdpa",
)


def _transformers_fix(kind: str, calls: Sequence[str]) -> str:
    """Hugging Face transformers' own remedy for a sync inside a model's forward.

    The syncs a plain ``model(input_ids=..., labels=...)`` makes in transformers 4.5x (seen on
    BERT, GPT-2 and Llama): a look for padding when no mask was given, and the SDPA path's
    check whether the mask hides anything. Both are skipped while ``torch.compile`` traces
    (``is_torchdynamo_compiling()``), which then always applies the mask.
    """
    names = [c.rsplit(".", 1)[-1] for c in calls]
    if "warn_if_padding_and_no_attention_mask" in names:
        return (
            "transformers looks for padding in input_ids on every forward because no "
            "attention_mask was passed (warn_if_padding_and_no_attention_mask reads "
            "`pad_token_id in input_ids`): pass the tokenizer's attention_mask= with the input_ids"
        )
    if "_ignore_causal_mask_sdpa" in names:
        return (
            "transformers checks on every forward whether the padding mask hides any token "
            "(_ignore_causal_mask_sdpa: padding_mask.all()), so that SDPA can use is_causal: "
            "batches that are never padded can leave attention_mask=None (no check); otherwise "
            "torch.compile(model) skips it (the mask is then always applied)"
        )
    check = next((n for n in names if n in _HF_MASK_CHECKS), None)
    if check is not None:
        return (
            "transformers checks on every forward whether the attention mask is all ones "
            f"({check}: torch.all(mask == 1)), even a mask it built itself, to leave it out of "
            "SDPA: torch.compile(model) skips the check (the mask is then always applied); "
            "otherwise it is one small sync a forward, worth removing only when steps are short"
        )
    outer = calls[0] if calls else "this call"
    return (
        f"Hugging Face transformers syncs inside {outer} ({kind}) on every call, most often "
        "checking an input it was not given (a mask, padding, a size): the line inside "
        "transformers shows which; pass that input explicitly, or call it outside the "
        "training step when it is not the model's forward"
    )


def library_fix(library: str, kind: str, location: str = "", calls: Sequence[str] = ()) -> str:
    """The setting behind a sync inside ``library``.

    Args:
        library: the top-level package (:func:`library_name`).
        kind: what synced (a key of ``FIXES``).
        location: the line inside the library (``torch_geometric/utils/loop.py:650``).
        calls: the library's functions on the stack, outermost first (:func:`library_calls`).

    Example:
        >>> library_fix("torch_geometric", "masked index", "torch_geometric/utils/loop.py:650",
        ...             ["GCNConv.forward", "gcn_norm", "add_remaining_self_loops"])
        "PyG's GCNConv adds self loops ... GCNConv(..., cached=True)... add_self_loops=False)"
    """
    if library == "torch_geometric":
        return _pyg_fix(kind, location, calls)
    if library == "torchmetrics":
        return (
            "a torchmetrics metric called as `self.metric(preds, target)` computes the batch's "
            "value every step (and a metric object logged with on_step=True is computed every "
            "step): call `self.metric.update(preds, target)` in the step and log the metric "
            "object with on_step=False, on_epoch=True, so it is computed once per epoch"
        )
    if library == "transformers":
        return _transformers_fix(kind, calls)
    if library == "torch" and "_detect_is_causal_mask" in calls:
        return (
            "torch's nn.Transformer (its encoder and decoder) compares the attention mask it is "
            "given with a causal mask on every forward (_detect_is_causal_mask), to find out "
            "whether it is causal: say so, `nn.Transformer(...)(src, tgt, tgt_mask=mask, "
            "tgt_is_causal=True)` (`src_is_causal=`; `is_causal=` for TransformerEncoder and "
            "TransformerDecoder), True for a causal mask, False otherwise"
        )
    if library in ("datasets", "accelerate"):
        return (
            f"Hugging Face {library} syncs inside this call ({kind}); call it every N steps or "
            "outside the training step"
        )
    return f"{library} syncs inside this call ({kind}); call it less often than every step"


def matches_allow(filename: str, lineno: int, patterns: Sequence[str]) -> bool:
    """Whether ``filename:lineno`` matches one of ``patterns`` (``"dir/file.py:12"`` or a glob).

    A pattern without a line number matches every line of the file; a relative pattern
    matches any absolute path that ends with it.
    """
    loc = f"{filename}:{lineno}".replace(os.sep, "/")
    for pattern in patterns:
        pat = pattern.replace(os.sep, "/")
        candidates = [pat] if re.search(r":[\d*?\[\]]+$", pat) else [pat, f"{pat}:*"]
        for cand in candidates:
            if fnmatch.fnmatchcase(loc, cand) or fnmatch.fnmatchcase(loc, f"*/{cand}"):
                return True
    return False


def framework_fix(finding: SyncFinding) -> str:
    """The Trainer setting (or upgrade) that avoids a framework sync."""
    where = f"{finding.filename} {finding.function}"
    if "lightning_speedpack" in finding.filename:
        return (
            "lightning-speedpack combines the ranks' counts once per logging step (one small "
            "all-reduce): raise log_every_n_steps to do it less often"
        )
    if "sigterm" in where:
        return (
            "Lightning broadcasts a SIGTERM flag and reads it with .item() every DDP step "
            "(Lightning issues 21487/21640); one small sync per step, fixed upstream"
        )
    if "progress" in where or "pbar" in finding.code:
        return (
            "the progress bar reads logged values every refresh: enable_progress_bar=False, "
            "fewer prog_bar=True values, or a larger refresh_rate"
        )
    if finding.library:  # a library Lightning's code called (torchmetrics; torch's nn modules)
        return library_fix(
            finding.library, finding.kind, finding.library_location, finding.library_calls
        )
    if "logger_connector" in where or "result" in where:
        return "logged values are read when written: raise Trainer(log_every_n_steps=...)"
    if finding.kind == "pageable copy":
        return FIXES["pageable copy"]
    return "a Lightning internal; check its settings for this hook, or ignore it"
