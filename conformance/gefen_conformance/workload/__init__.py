"""What the suite feeds an implementation (SPEC 4.2.4, 4.3).

Each module is imported by name, and each name from the module that defines it:

* ``models``: the named models, their deterministic initial values and gradients, training them;
* ``saving``: save and load through an implementation's DCP adapter;
* ``runs``: the optimizer comparisons' runs of the reference and an implementation;
* ``space``: the optimizer's input space (SPEC 4.3.10), and ``space_driver``, which drives one
  side through a case;
* ``stack``: the training stack (FSDP2, GradScaler, schedules; SPEC 4.3.14);
* ``checkpoint_in_memory``: DCP storage held in memory, for scenarios that inspect what an adapter
  writes.
"""
