"""What the suite feeds an implementation (SPEC 4.2.4, 4.3).

``models``: the named models, their deterministic initial values and gradients, and the
train/save/load helpers every scenario and golden uses; ``space``: the optimizer's input space as
hypothesis strategies (SPEC 4.3.10); ``checkpoint_in_memory``: DCP storage held in memory, for
scenarios that inspect what an adapter writes.
"""
