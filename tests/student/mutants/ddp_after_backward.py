"""The 2026 get_ddp written as naive DDP: every gradient all-reduced (asynchronously, then waited for) in
finish_gradient_synchronization, once backward has returned. The gradients are right and the course's test passes;
but the adapter asks for "asynchronously communicating gradients as they are ready in the backward pass"."""
import torch
import torch.distributed as dist


class AfterBackwardDDP(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        for p in module.parameters():
            dist.broadcast(p.data, src=0)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        works = [dist.all_reduce(g, async_op=True) for g in grads]  # BUG: only after backward
        for w, g in zip(works, grads):
            w.wait()
            g /= dist.get_world_size()


def get_ddp(module):
    return AfterBackwardDDP(module)


def ddp_on_after_backward(ddp_model, optimizer):
    ddp_model.finish_gradient_synchronization()
