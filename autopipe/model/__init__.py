"""Which model, and how to load it: a model file, its factory and kwargs, the user's code run safely.

- :mod:`.spec`: :class:`ModelSpec` (model file, factory, kwargs) and ``-k`` parsing;
- :mod:`.load`: load a model file in autopipe's convention into a :class:`LoadedModel`;
- :mod:`.usercode`: exceptions from the user's code as one-line messages.
"""
