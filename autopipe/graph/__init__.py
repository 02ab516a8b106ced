"""The model as a graph: trace it, group its nodes into blocks, cut segments out of it.

- :mod:`.trace`: torch.fx ``symbolic_trace`` or ``torch.export``, one interface;
- :mod:`.blocks`: nodes grouped into blocks that follow the user's modules;
- :mod:`.canon`: node keys that ignore names; a trace renamed to another rank's naming;
- :mod:`.segment`: a set of nodes cut out as a runnable GraphModule;
- :mod:`.outputs`: the model's output (and training loss) from a graph's flat outputs;
- :mod:`.split_backward`: a backward split into input gradients (B) and weight gradients (W).
"""
