"""FSDP as a student writes it from the 2026 handout, with module hooks: each Linear/Embedding weight becomes a flat
fp32 shard; a forward pre-hook all-gathers it (cast to compute_dtype first) into a buffer, prefetching the next layer;
the forward post-hook frees the buffer (its storage resized to 0: autograd keeps only an empty tensor); a hook on the
layer's output gathers it again when backward reaches the layer; the weight's gradient is reduce-scattered (async)
and the buffer freed. Correct: it must pass every check within the handout's contract. The mutants in
tests/student/mutants subclass it to break one rule each."""
import torch
import torch.distributed as dist
import torch.nn as nn


def _sharded(m):
    return type(m).__name__ in ("Linear", "Embedding") and isinstance(getattr(m, "weight", None), nn.Parameter)


class Unit:
    """One layer's shard, its gather buffer and its pending gather."""

    def __init__(self, module, shard, shape, numel, dtype):
        self.module, self.shard, self.shape, self.numel = module, shard, shape, numel
        self.buf = torch.empty(shard.numel() * dist.get_world_size(), dtype=dtype)
        self.buf.untyped_storage().resize_(0)
        self.handle = self.sent = None

    def gathered(self):
        return self.buf.untyped_storage().nbytes() > 0


class HookFSDP(nn.Module):
    def __init__(self, module, compute_dtype=None):
        super().__init__()
        self.module, self.compute_dtype = module, compute_dtype
        self.world, rank = dist.get_world_size(), dist.get_rank()
        for p in module.parameters():
            dist.broadcast(p.data, src=0)
        self.names, self.units, self.order, self.pending = {}, [], None, []
        names = {id(p): n for n, p in module.named_parameters()}
        self.shards = nn.ParameterList()
        for m in [m for m in module.modules() if _sharded(m)]:
            w = m.weight
            n = -(-w.numel() // self.world)
            flat = torch.zeros(n * self.world)
            flat[: w.numel()] = w.detach().reshape(-1)
            shard = nn.Parameter(flat[rank * n : (rank + 1) * n].clone())
            unit = Unit(m, shard, w.shape, w.numel(), compute_dtype or torch.float32)
            self.names[names[id(w)]] = unit
            del m._parameters["weight"]
            m.weight = None
            m._unit = unit
            self.units.append(unit)
            self.shards.append(shard)
            m.register_forward_pre_hook(self._pre_forward)
            m.register_forward_hook(self._post_forward)
        self.replicated = [p for p in module.parameters() if p.requires_grad]

    # ---- gathering and freeing ----

    def start_gather(self, unit):
        if unit.gathered() or unit.handle is not None:
            return
        unit.buf.untyped_storage().resize_(unit.buf.numel() * unit.buf.element_size())
        unit.sent = unit.shard.detach().to(unit.buf.dtype)
        unit.handle = dist.all_gather_into_tensor(unit.buf.data, unit.sent, async_op=True)

    def wait(self, unit):
        if unit.handle is not None:
            unit.handle.wait()
            unit.handle = unit.sent = None

    def free(self, unit):
        self.wait(unit)
        unit.buf.untyped_storage().resize_(0)

    # ---- hooks ----

    def forward(self, *args, **kwargs):
        self.calls = []
        out = self.module(*args, **kwargs)
        if self.order is None:
            self.order = self.calls
        return out

    def _pre_forward(self, m, args):
        unit = m._unit
        self.calls.append(unit)
        self.start_gather(unit)
        if self.order is not None and len(self.calls) < len(self.order):
            self.start_gather(self.order[len(self.calls)])  # prefetch the next layer
        self.wait(unit)
        full = unit.buf.data[: unit.numel].view(unit.shape)
        full.requires_grad_(True)
        full.register_post_accumulate_grad_hook(lambda t, unit=unit: self._grad_ready(unit, t))
        m.weight = full
        if self.compute_dtype is not None:
            args = tuple(a.to(self.compute_dtype) if torch.is_floating_point(a) else a for a in args)
        return args

    def _post_forward(self, m, args, out):
        self.after_forward(m._unit)
        m.weight = None
        if out.requires_grad:
            out.register_hook(lambda g, unit=m._unit: self.before_backward(unit))

    def after_forward(self, unit):
        self.free(unit)

    def before_backward(self, unit):
        self.start_gather(unit)
        self.wait(unit)

    def _grad_ready(self, unit, full):
        grad, full.grad = full.grad, None
        flat = torch.zeros(unit.buf.numel())
        flat[: unit.numel] = grad.reshape(-1).float() / self.world
        out = torch.empty_like(unit.shard)
        handle = dist.reduce_scatter_tensor(out, flat, async_op=True)
        self.pending.append((handle, out, flat, unit))
        self.after_backward(unit)

    def after_backward(self, unit):
        self.free(unit)

    def release_all(self):
        for unit in self.units:
            self.free(unit)

    def finish_gradient_synchronization(self):
        for handle, out, _, unit in self.pending:
            handle.wait()
            unit.shard.grad = out if unit.shard.grad is None else unit.shard.grad + out
        self.pending = []
        self.release_all()
        for p in self.replicated:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)
            p.grad /= self.world

    def gather_full_params(self):
        out = {}
        for name, p in self.module.named_parameters():
            out[name] = p.detach().clone()
        for name, unit in self.names.items():
            flat = torch.empty(unit.shard.numel() * self.world)
            dist.all_gather_into_tensor(flat, unit.shard.detach())
            out[name] = flat[: unit.numel].view(unit.shape).clone()
        return out


FSDP = HookFSDP


def get_fsdp(module, compute_dtype=None):
    return FSDP(module, compute_dtype=compute_dtype)


def fsdp_on_after_backward(fsdp_model, optimizer):
    fsdp_model.finish_gradient_synchronization()


def fsdp_gather_full_params(fsdp_model):
    return fsdp_model.gather_full_params()
