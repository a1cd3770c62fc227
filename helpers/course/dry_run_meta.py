"""What the meta device lacks for a dry run, supplied (helpers.course.dry_run uses these):

    with on_meta():                     # every tensor on meta, bytes counted, ids bound-checked, shapes memoized
        with fake_group(world=2):       # a rank of a 2-rank job: collectives that move nothing
            with torch.autocast("meta", torch.bfloat16):   # CUDA autocast's casts (autocast_like)
                ...

- IndexBounds: a GPU's device-side index assert (ids past an embedding's rows), which meta tensors cannot make.
- unseen_placeholders: FSDP's ShardedWeight stand-ins are meta by design (no bytes on a GPU either); not counted.
- meta_addresses: every meta tensor's data_ptr() is 0, so code that asks "is this gradient already my bucket's
  view?" by address (helpers.ddp, helpers.sharding) would take every tensor for every other; inside, a meta
  storage's address is its own (distinct while it lives) and a tensor's is that plus its offset, as on a GPU.
- MetaMode: a float read off a meta tensor (float(t), t.item(): a worker's reported differences) is nan, as there is
  no value to read; an integer or bool read (a value that could steer control flow) still raises.
- MetaMode: the meta kernels of elementwise ops are Python (0.1-5 ms a call); an op seen before with the same input
  shapes, strides and dtypes gets fresh outputs of the recorded shapes at once (tests/test_dry_run.py checks every
  hit against the kernel), and random initializers, which have no values to draw on meta, return at once.
- fake_group: torch's fake process group ("fake" backend, torch.testing._internal.distributed.fake_pg) on cpu and
  meta, so DDP buckets, sharded optimizer states and FSDP's gathers are built and stepped on one rank's meta tensors.
- autocast_like: meta tensors have no autocast dispatch key, and CUDA autocast casts only CUDA tensors; this applies
  CUDA autocast's policy, read from torch's own ATen/autocast_mode.h, at the Python call (linear, matmul, softmax...),
  where the casts are recorded by autograd as autocast's are (the weights' copies cached per forward).
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import weakref
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_unflatten

from helpers import launch as L
from helpers import memory as M

META = torch.device("meta")
aten = torch.ops.aten
_ARANGE = {aten.arange.default: 0, aten.arange.start: 1, aten.arange.start_step: 1}  # op -> position of `end`
_RANDINT = {aten.randint.default: 0, aten.randint.generator: 0, aten.randint.low: 1, aten.randint.low_generator: 1}


class IndexBounds:
    """Index checks a meta tensor cannot make: ids made by arange or randint keep their bound (every value < bound,
    through copies and views), and an embedding lookup whose bound exceeds its rows raises, as a GPU's device-side
    assert would (then the CUDA context is lost). MetaMode calls it around every op."""

    def __init__(self):
        self.bounds = {}  # storage key -> bound

    def _set(self, t: torch.Tensor, bound: int) -> None:
        key = M.storage_key(t)
        self.bounds[key] = bound
        weakref.finalize(t.untyped_storage(), self.bounds.pop, key, None)

    def check(self, func, args) -> None:
        """Before `func`: an embedding lookup whose ids may exceed its rows raises IndexError."""
        if func in (aten.embedding.default, aten.index_select.default):
            weight, ids = (args[0], args[1]) if func is aten.embedding.default else (args[0], args[2])
            bound = self.bounds.get(M.storage_key(ids))
            if bound is not None and bound > weight.shape[0]:
                raise IndexError(
                    f"dry run: ids up to {bound - 1} index an embedding of {weight.shape[0]} rows "
                    f"(ids {tuple(ids.shape)}); on a GPU: a device-side assert"
                )

    def record(self, func, args, out) -> None:
        """After `func`: the bound of ids it made (arange, randint) or copied."""
        bound = None
        if func in _ARANGE:
            bound = int(args[_ARANGE[func]])
        elif func in _RANDINT:
            bound = int(args[_RANDINT[func]])
        elif func is aten._to_copy.default and isinstance(args[0], torch.Tensor):
            bound = self.bounds.get(M.storage_key(args[0]))
        if bound is not None and isinstance(out, torch.Tensor):
            self._set(out, bound)


# ---- memoized meta kernels ----

_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


def _signature(a):
    """What an op's output shapes can depend on, hashable: a meta tensor's shape, strides, dtype and offset; plain
    values as they are. TypeError for anything else (a generator, a process group): not memoized."""
    if isinstance(a, torch.Tensor):
        if not a.is_meta or a.layout != torch.strided:
            raise TypeError("not a strided meta tensor")
        return (a.shape, a.stride(), a.dtype, a.storage_offset())
    if isinstance(a, (list, tuple)):
        return (type(a), tuple(map(_signature, a)))
    if isinstance(a, dict):
        return (dict, tuple((k, _signature(v)) for k, v in sorted(a.items())))
    if isinstance(a, _PLAIN):
        return (type(a), a)
    raise TypeError(type(a).__name__)


@functools.cache
def _memoizable(func) -> bool:
    """An aten op that makes new tensors: not in place, no output aliasing an input (views run every time). Asked
    once per op (half a million calls in the dry run)."""
    schema = func._schema
    return func.namespace == "aten" and not schema.is_mutable and not any(r.alias_info for r in schema.returns)


_NO_DATA = {aten.normal_.default, aten.uniform_.default, aten.fill_.Scalar, aten.zero_.default}  # in place, values only


class MetaMode(TorchDispatchMode):
    """The dry run's one dispatch mode below the tracker: index bounds (IndexBounds), in-place initializers as the
    no-ops they are on meta (their decompositions draw whole tensors), and memoized meta kernels: an op called again
    with inputs of the same metadata gets fresh meta outputs of the shapes, strides and dtypes its first call made
    (only where every output is a new dense storage). check=True runs the kernel on every hit too and raises where
    the two differ (the tests); memoize=False runs every kernel."""

    def __init__(self, memoize: bool = True, check: bool = False):
        super().__init__()
        self.memoize, self.check, self.cache, self.hits = memoize, check, {}, 0
        self.index = IndexBounds()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.index.check(func, args)
        if func in _NO_DATA and args[0].device.type == "meta" and not self.check:
            return args[0]
        if func is aten._local_scalar_dense.default and args[0].device.type == "meta" and args[0].is_floating_point():
            return math.nan  # a float read off a meta tensor (a worker's max |difference|): no value, a placeholder
        out = self._run(func, args, kwargs)
        self.index.record(func, args, out)
        return out

    def _run(self, func, args, kwargs):
        key = None
        if self.memoize and _memoizable(func):
            try:
                key = (func, _signature(args), _signature(kwargs))
            except TypeError:
                key = None
        spec = self.cache.get(key) if key is not None else None
        if spec is not None and not self.check:
            self.hits += 1
            return _make(spec)
        out = func(*args, **kwargs)
        if key is not None:
            made = _spec(out, args)
            if spec is not None and made != spec:
                raise AssertionError(f"MetaMode: {func} made {made[0]}, the memoized outputs are {spec[0]}")
            if made is not None:
                self.cache[key] = made
                self.hits += spec is not None
        return out


def _spec(out, args):
    """(each output's shape, strides, dtype; the output structure), or None where an output is not a new dense meta
    storage of its own (then the op is not memoized)."""
    leaves, tree = tree_flatten(out)
    inputs = {a.untyped_storage()._cdata for a in tree_flatten(args)[0] if isinstance(a, torch.Tensor)}
    seen, metas = set(), []
    for t in leaves:
        if not isinstance(t, torch.Tensor) or t.device.type != "meta" or t.layout != torch.strided:
            return None
        storage = t.untyped_storage()
        spanned = (sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) + 1) * t.element_size()
        if storage._cdata in inputs | seen or t.storage_offset() or storage.nbytes() != (spanned if t.numel() else 0):
            return None
        seen.add(storage._cdata)
        metas.append((tuple(t.shape), t.stride(), t.dtype))
    return tuple(metas), tree


def _make(spec):
    metas, tree = spec
    return tree_unflatten([torch.empty_strided(s, st, dtype=dt, device=META) for s, st, dt in metas], tree)


@contextlib.contextmanager
def meta_addresses():
    """data_ptr() of meta tensors and storages: distinct per live storage (plus the tensor's offset in bytes), as a
    device's addresses are, instead of 0 for all; other devices' as they are."""
    tensor_ptr, storage_ptr = torch.Tensor.data_ptr, torch.UntypedStorage.data_ptr

    def tensor_address(t):
        if t.device.type != "meta":
            return tensor_ptr(t)
        return t.untyped_storage()._cdata + t.storage_offset() * t.element_size()

    def storage_address(s):
        return s._cdata if s.device.type == "meta" else storage_ptr(s)

    with (
        _patched(torch.Tensor, "data_ptr", tensor_address),
        _patched(torch.UntypedStorage, "data_ptr", storage_address),
    ):
        yield


@contextlib.contextmanager
def _patched(owner, name: str, value):
    """owner.name = value inside; after, as it was (deleted again where the class only inherited it)."""
    own = name in vars(owner)
    saved = vars(owner)[name] if own else None  # the raw attribute (a staticmethod stays one)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if own:
            setattr(owner, name, saved)
        else:
            delattr(owner, name)


@contextlib.contextmanager
def unseen_placeholders():
    """helpers.fsdp's ShardedWeight, the full-shape stand-in a sharded module keeps outside its forward, is a meta
    tensor on a GPU too (it holds nothing): made out of the memory tracker's sight, as it holds no bytes there."""
    from helpers.fsdp_storage import ShardedWeight

    real = ShardedWeight.__new__

    def new(cls, *args, **kwargs):
        with _disable_current_modes():
            return real(cls, *args, **kwargs)

    with _patched(ShardedWeight, "__new__", staticmethod(new)):
        yield


@contextlib.contextmanager
def on_meta(memoize: bool = True):
    """Experiment functions inside run as on a GPU rank with every tensor on the meta device: helpers.launch.device()
    is meta, factories default to it, the memory tracker counts meta bytes, ids are bound-checked, meta kernels are
    memoized, meta tensors have addresses, and torch.autocast("meta", ...) applies CUDA autocast's policy."""
    with contextlib.ExitStack() as stack:
        for ctx in (
            MetaMode(memoize),
            meta_autocast(),
            meta_addresses(),
            unseen_placeholders(),
            L.using_device(META),
            META,
            M.counting_meta(),
        ):
            stack.enter_context(ctx)
        yield


# ---- one rank of a multi-rank job ----


@contextlib.contextmanager
def fake_group(world: int = 2, rank: int = 0):
    """This process as `rank` of `world` with torch's fake process group on cpu and meta tensors: every collective
    returns at once and moves nothing (the tensors keep their bytes and shapes). Destroyed on exit."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

    if dist.is_initialized():
        raise RuntimeError("dry run: a process group is already initialized in this process; run it in a fresh one")
    dist.init_process_group("cpu:fake,meta:fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


# ---- CUDA autocast's policy on meta tensors ----

HEADER = Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"
_LISTS = {  # the header's op lists -> the policy CUDA autocast applies to them
    "AT_FORALL_LOWER_PRECISION_FP": "lower",
    "AT_FORALL_FP32": "fp32",
    "AT_FORALL_FP32_SET_OPT_DTYPE": "fp32_set_opt_dtype",
    "AT_FORALL_PROMOTE": "promote",
}
_ALIASES = {"__matmul__": "matmul", "__rmatmul__": "matmul", "__pow__": "pow", "__rpow__": "pow"}


@functools.cache
def autocast_policy() -> dict[str, str]:
    """aten op name -> CUDA autocast's cast policy, read from the installed torch's ATen/autocast_mode.h (the lists
    its CUDA kernels are registered from)."""
    if not HEADER.is_file():
        raise ValueError(f"dry run: {HEADER} is not installed, so CUDA autocast's op lists are unknown here")
    text, policy = HEADER.read_text(), {}
    for macro, kind in _LISTS.items():
        block = re.search(rf"#define {macro}\(_\)(.*?)\n\s*\n", text, re.S)
        if block is None:
            raise ValueError(f"dry run: {macro} not found in {HEADER}")
        for name in re.findall(r"_\((\w+)", block.group(1)):
            policy.setdefault(name, kind)
    return policy


class autocast_like(TorchFunctionMode):  # noqa: N801  (used as torch.autocast is)
    """torch.autocast("cuda", dtype)'s casts for meta tensors, at the Python call: `lower` ops (linear, matmul,
    sdpa...) cast float inputs to `dtype`, a float32 leaf weight once per region (autocast's cache); `fp32` ops cast
    16-bit inputs up; `fp32_set_opt_dtype` ops (softmax, sum...) get dtype=float32 unless one is given; `promote` ops
    run at the widest input type. F.cross_entropy as aten runs it: log_softmax in the logits' dtype, nll_loss on an
    fp32 copy. Backward runs as autograd recorded it, as under autocast."""

    def __init__(self, dtype=torch.bfloat16, enabled: bool = True):
        super().__init__()
        self.dtype, self.enabled, self.cache = dtype, enabled, {}

    def __enter__(self):
        return super().__enter__() if self.enabled else self

    def __exit__(self, *exc):
        self.cache.clear()
        return super().__exit__(*exc) if self.enabled else None

    def _cast(self, a, to):
        """a cast to `to` as autocast's cached_cast does it (other values as they are)."""
        if not (isinstance(a, torch.Tensor) and a.is_floating_point() and a.dtype != torch.float64 and a.dtype != to):
            return a
        if to == self.dtype and a.dtype == torch.float32 and a.requires_grad and a.is_leaf and not a._is_view():
            if id(a) not in self.cache:
                self.cache[id(a)] = (a, a.to(to))  # the weight itself kept, so its id stays its own
            return self.cache[id(a)][1]
        return a.to(to)

    def _cast_all(self, args, kwargs, to):
        """Every argument cast, the last first: autocast's C++ wrappers cast a call's arguments in one pack expansion,
        which GCC evaluates right to left (the order decides which copy is alive at a transient peak)."""
        leaves, tree = tree_flatten((args, kwargs))
        return tree_unflatten([self._cast(a, to) for a in reversed(leaves)][::-1], tree)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "cross_entropy":
            return self._cross_entropy(*args, **kwargs)
        kind = autocast_policy().get(_ALIASES.get(name, name))
        if kind is None:
            return func(*args, **kwargs)
        floats = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor) and a.is_floating_point()]
        if not floats:
            return func(*args, **kwargs)
        if kind == "lower":
            args, kwargs = self._cast_all(args, kwargs, self.dtype)
        elif kind == "fp32":
            args, kwargs = self._cast_all(args, kwargs, torch.float32)
        elif kind == "fp32_set_opt_dtype":
            explicit = kwargs.get("dtype") is not None or any(isinstance(a, torch.dtype) for a in args)
            first = args[0] if args else None
            if not explicit and isinstance(first, torch.Tensor) and first.is_floating_point():
                kwargs = {**kwargs, "dtype": torch.float32}
        elif kind == "promote":
            widest = torch.float32 if any(t.dtype == torch.float32 for t in floats) else self.dtype
            args, kwargs = self._cast_all(args, kwargs, widest)
        return func(*args, **kwargs)

    def _cross_entropy(self, input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                       reduction="mean", label_smoothing=0.0):  # fmt: skip
        """aten's cross_entropy_loss under CUDA autocast: log_softmax with dtype=the input's (explicit: not
        changed), then nll_loss (an fp32 op) on an fp32 copy of the log-probabilities."""
        if weight is not None or label_smoothing or size_average is not None or reduce is not None:
            raise NotImplementedError("dry run's autocast: F.cross_entropy with weights or label smoothing")
        logp = torch.log_softmax(input, 1 if input.dim() > 1 else 0, dtype=input.dtype)
        return F.nll_loss(self._cast(logp, torch.float32), target, ignore_index=ignore_index, reduction=reduction)


@contextlib.contextmanager
def meta_autocast():
    """torch.autocast("meta", dtype) becomes autocast_like(dtype) inside (torch refuses the meta device), so the
    experiments' own autocast regions run in a dry run; any other device type gets torch's autocast."""
    real = torch.autocast

    def autocast(device_type, dtype=None, enabled=True, cache_enabled=None):
        if device_type == "meta":
            return autocast_like(dtype or torch.bfloat16, enabled)
        return real(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    with _patched(torch, "autocast", autocast):
        yield
