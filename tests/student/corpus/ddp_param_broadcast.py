"""DDP as an nn.Module that broadcasts the parameters from rank 0 (as the handout asks; buffers are left alone) and
all-reduces each gradient, pre-divided by the world size, as soon as autograd has it."""
import torch
import torch.distributed as dist


class DDP(torch.nn.Module):
    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        self._pending = []
        with torch.no_grad():
            for param in self.module.parameters():
                dist.broadcast(param, src=0)
        for param in self.module.parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(self._sync)

    def _sync(self, param):
        param.grad.div_(self.world_size)
        self._pending.append(dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, async_op=True))

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def finish_gradient_synchronization(self):
        for work in self._pending:
            work.wait()
        self._pending = []


def get_ddp(module):
    return DDP(module)


def ddp_on_after_backward(ddp_model, optimizer):
    ddp_model.finish_gradient_synchronization()
