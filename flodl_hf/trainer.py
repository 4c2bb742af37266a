"""Trainer: the entry points that turn a model or task head into a Graph training on 1..N devices.

``setup*`` (setup mode: the user owns the loop) places a replica built by the user's factory on this rank's
device, copies the user's weights into it, makes every rank's replica bit-identical (broadcast from rank 0),
builds one optimizer per rank and, on N ranks, connects the Graph to the El Che gradient windows.
``builder(...)`` is the framework-owned alternative (see ``flodl_hf.builder``).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import torch

from .config import DdpConfig
from .diagnostics import describe_device, diagnostic_line, print_diagnostic
from .graph import Graph, HasGraph
from .replica import carry_module_state, watch_source

__all__ = ["Trainer"]

ModuleFactory = Callable[[torch.device], Any]
OptimizerFactory = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]


def _as_graph(target: Any) -> Graph:
    if isinstance(target, Graph):
        return target
    if isinstance(target, torch.nn.Module):
        raise TypeError("Trainer.setup takes a Graph or a task head: wrap the module first, "
                        "e.g. graph = Graph(model); Trainer.setup(graph, builder, optimizer)")
    if isinstance(target, HasGraph):
        return target.graph()
    raise TypeError(f"Trainer.setup takes a Graph or a task head (HasGraph), got {type(target).__name__}")


def _module_from(built: Any, what: str) -> torch.nn.Module:
    if isinstance(built, torch.nn.Module):
        return built
    if isinstance(built, HasGraph):
        return built.graph().module
    raise TypeError(f"the {what} must return a torch.nn.Module or a task head, got {type(built).__name__}")


class Trainer:
    """Entry points of flodl-hf training (all static)."""

    @staticmethod
    def setup(graph: Any, builder: ModuleFactory, optimizer: OptimizerFactory) -> Graph:
        """Setup mode with default settings; see :meth:`setup_with`."""
        return Trainer.setup_with(graph, builder, optimizer, DdpConfig())

    @staticmethod
    def setup_with(graph: Any, builder: ModuleFactory, optimizer: OptimizerFactory, config: DdpConfig) -> Graph:
        """Place ``graph`` on this rank's device and make ``graph.step()`` train on every rank.

        ``builder(device)`` must build the same architecture as ``graph.module`` directly on ``device`` (it runs
        once per rank); the weights of ``graph.module`` are copied into it, then rank 0's are broadcast, and so are
        its ``requires_grad`` flags, each submodule's train/eval mode and gradient checkpointing
        (``flodl_hf.replica``). From then on the loop must call ``graph.module`` (the replica), not the module it
        wrapped: a backward pass through that one is refused at the first ``graph.step()``.
        ``optimizer(params)`` builds this rank's optimizer.
        """
        from .distributed.context import init_context

        if not isinstance(config, DdpConfig):
            raise TypeError(f"config must be a DdpConfig, got {type(config).__name__}")
        target = _as_graph(graph)
        ctx = init_context(config)
        replica = _module_from(builder(ctx.device), "builder / head factory")
        replica = replica.to(ctx.device)
        source = target.module.state_dict()
        try:
            replica.load_state_dict(source, strict=True)
        except RuntimeError as exc:
            raise ValueError("the factory built a module whose weights do not match the one being set up "
                             f"(build the same architecture and config): {exc}") from exc
        carry_module_state(target.module, replica, warn=config.verbose and ctx.rank == 0)
        runtime = None
        if ctx.is_distributed:
            from .distributed.collectives import broadcast_tensors
            from .distributed.window import WindowRuntime

            broadcast_tensors([p.data for p in replica.parameters()] + list(replica.buffers()), src=0)
            runtime = WindowRuntime(ctx, config, replica)
        opt = optimizer(replica.parameters())
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"the optimizer factory must return a torch.optim.Optimizer, got {type(opt).__name__}")
        _check_optimizer_params(opt, replica)
        if config.lr_scaling != "none":
            from .elche.lr_scaling import lr_exponent

            exponent = lr_exponent([c.__name__ for c in type(opt).__mro__])  # refuses an unknown optimizer
            if runtime is not None:
                runtime.lr_exponent = exponent
        target.attach(replica, opt, ctx.device, config, rank=ctx.rank, world_size=ctx.world_size, runtime=runtime,
                      source_watch=watch_source(target.module, replica))
        if config.verbose:
            _announce(ctx, config)
        return target

    @staticmethod
    def setup_head(head: Any, head_factory: ModuleFactory, optimizer: OptimizerFactory) -> Any:
        """Setup mode for a task head with default settings; returns the head (its graph is ready)."""
        return Trainer.setup_head_with(head, head_factory, optimizer, DdpConfig())

    @staticmethod
    def setup_head_with(head: Any, head_factory: ModuleFactory, optimizer: OptimizerFactory,
                        config: DdpConfig) -> Any:
        """Rebuild ``head`` on this rank's device with ``head_factory(device)`` and train it through its graph."""
        if not isinstance(head, HasGraph):
            raise TypeError(f"setup_head takes a task head with a graph() method, got {type(head).__name__}")
        Trainer.setup_with(head.graph(), head_factory, optimizer, config)
        return head

    @staticmethod
    def builder(model_factory: Callable[[torch.device], torch.nn.Module],
                optim_factory: OptimizerFactory, train_fn: Callable[..., Any]) -> Any:
        """Builder mode: the framework owns the loop (local SGD with SYNC / CADENCE / ASYNC averaging)."""
        from .builder import DdpBuilder

        return DdpBuilder(model_factory, optim_factory, train_fn)


def _check_optimizer_params(opt: torch.optim.Optimizer, replica: torch.nn.Module) -> None:
    """Refuse an optimizer over parameters that are not the replica's: it would step tensors nothing trains (a
    factory that grouped the user's own model's parameters by name), and the run would never learn, silently."""
    own = {id(p) for p in replica.parameters()}
    foreign = sum(1 for group in opt.param_groups for p in group["params"] if id(p) not in own)
    if foreign:
        raise ValueError(
            f"the optimizer factory built an optimizer over {foreign} parameter(s) that are not those it was given "
            "(the replica this rank trains), so nothing would train: build it from the parameters the factory "
            "receives. To group them by name (e.g. no weight decay for biases), zip them with your model's names, "
            "which come in the same order: names = [n for n, _ in model.named_parameters()]; then "
            "lambda ps: AdamW([{'params': [p for n, p in zip(names, ps) if 'bias' not in n]}, ...])")


def _announce(ctx: Any, config: DdpConfig) -> None:
    description = describe_device(ctx.device)
    if ctx.is_distributed:
        import torch.distributed as dist

        from .distributed.context import side_group

        gathered: list[Optional[tuple[str, str]]] = [None] * ctx.world_size
        dist.all_gather_object(gathered, (str(ctx.device), description), group=side_group())
        devices = [torch.device(g[0]) for g in gathered if g is not None]
        descriptions = [g[1] for g in gathered if g is not None]
    else:
        devices, descriptions = [ctx.device], [description]
    if ctx.rank != 0:
        return
    el_che_on = config.max_anchor != 0
    print_diagnostic(diagnostic_line(devices, descriptions, threads=torch.get_num_threads(),
                                     simulate_speeds=config.simulate_speeds, el_che=el_che_on))
    bound = config.window_bound()
    if ctx.world_size > 1 and config.fixed_anchor is None and config.replay_plan is None and bound > 1:
        print_diagnostic(f"flodl-hf: El Che may average up to {bound} micro-batches per rank in one optimizer step "
                         f"(max_anchor={bound}): fewer synchronisations for a larger, varying effective batch; "
                         "fixed_anchor=N keeps it constant")
