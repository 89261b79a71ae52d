"""CUDA graphs composed of other graphs, through the CUDA driver's graph API (ctypes on libcuda).

A round on the GPU is a chain of captured graphs and eager launches (`elpis.exl3.device_round`). PyTorch can
keep a capture's `cudaGraph_t` (`torch.cuda.CUDAGraph(keep_graph=True)`, `raw_cuda_graph()`), but it cannot
launch one graph from inside another capture, and a graph launched on a stream under capture is documented as
failing. The driver composes them instead: each piece becomes a child graph node (the driver clones it, so the
composed graph runs the same kernels on the same addresses in the same order), each node depending on the one
before, and the whole is instantiated once and launched with one call.

`cudaGraph_t`/`CUgraph` and `cudaStream_t`/`CUstream` are the same handles in both APIs, so PyTorch's raw
handles go to the driver as they are.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Sequence
from functools import lru_cache

_VP = ctypes.c_void_p
_PVP = ctypes.POINTER(ctypes.c_void_p)
_ERR = ctypes.c_int

# the driver entries this module calls, with their argument types
ENTRY_ARGS: dict[str, tuple[type, ...]] = {
    "cuGetErrorString": (_ERR, ctypes.POINTER(ctypes.c_char_p)),
    "cuCtxGetCurrent": (_PVP,),
    "cuGraphCreate": (_PVP, ctypes.c_uint),
    "cuGraphAddChildGraphNode": (_PVP, _VP, _PVP, ctypes.c_size_t, _VP),
    "cuGraphInstantiateWithFlags": (_PVP, _VP, ctypes.c_ulonglong),
    "cuGraphUpload": (_VP, _VP),
    "cuGraphLaunch": (_VP, _VP),
    "cuGraphExecDestroy": (_VP,),
    "cuGraphDestroy": (_VP,),
}


class GraphComposeError(RuntimeError):
    """The driver refused a step of composing, instantiating or launching a graph."""


@lru_cache(maxsize=1)
def driver() -> ctypes.CDLL:
    """libcuda with the entries' signatures set (the process's driver: PyTorch has loaded it already)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise GraphComposeError(f"composed graphs need the CUDA driver (libcuda.so.1): {exc}") from exc
    for name, args in ENTRY_ARGS.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, _ERR
    return lib


def check(err: int, what: str) -> None:
    """Raise for a driver error code, with the driver's own name for it."""
    if err == 0:
        return
    text = ctypes.c_char_p()
    driver().cuGetErrorString(err, ctypes.byref(text))
    name = text.value.decode() if text.value else "unknown error"
    raise GraphComposeError(f"{what}: CUDA driver error {err} ({name})")


class ComposedGraph:
    """One executable graph of `children` (raw `cudaGraph_t` handles, each cloned as a child node) run one
    after another; `launch(stream)` queues it. The children may be destroyed once this is made."""

    def __init__(self, children: Sequence[int], stream: int) -> None:
        if not children:
            raise ValueError("a composed graph needs at least one child graph")
        if any(not isinstance(c, int) or c == 0 for c in children):
            raise ValueError("a composed graph's children are raw cudaGraph_t handles (non-zero ints)")
        lib = driver()
        context = _VP()
        check(lib.cuCtxGetCurrent(ctypes.byref(context)), "cuCtxGetCurrent")
        if not context.value:
            raise GraphComposeError("composing a graph needs this thread's CUDA context: use the GPU first")
        self._graph, self._exec = _VP(), _VP()
        check(lib.cuGraphCreate(ctypes.byref(self._graph), 0), "cuGraphCreate")
        try:
            before = _VP()
            for i, child in enumerate(children):
                node = _VP()
                deps, count = (ctypes.byref(before), 1) if i else (None, 0)
                check(lib.cuGraphAddChildGraphNode(ctypes.byref(node), self._graph, deps, count, _VP(child)),
                      f"cuGraphAddChildGraphNode (child {i})")  # fmt: skip
                before = node
            check(lib.cuGraphInstantiateWithFlags(ctypes.byref(self._exec), self._graph, 0),
                  "cuGraphInstantiateWithFlags")  # fmt: skip
            # the executable's upload now, in stream order, rather than inside its first launch
            check(lib.cuGraphUpload(self._exec, _VP(stream)), "cuGraphUpload")
        except BaseException:
            self.close()
            raise
        self.children = len(children)

    def launch(self, stream: int) -> None:
        """Queue the composed graph on `stream` (a raw cudaStream_t, 0 for the legacy default stream)."""
        if not self._exec.value:
            raise GraphComposeError("the composed graph was closed")
        check(driver().cuGraphLaunch(self._exec, _VP(stream)), "cuGraphLaunch")

    def close(self) -> None:
        """Free the driver's objects (a launch still running finishes first: the driver frees it after)."""
        lib = driver()
        if self._exec.value:
            lib.cuGraphExecDestroy(self._exec)
            self._exec = _VP()
        if self._graph.value:
            lib.cuGraphDestroy(self._graph)
            self._graph = _VP()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter shutdown the driver may be gone
            self.close()
