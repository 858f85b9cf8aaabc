"""The implementations the suite certifies: the plugin contract (``contract``: ``Implementation``,
``Capability``), how a ``--impl`` spec resolves (``registry``), implementations built on a DCP
adapter package (``dcp_adapter``), and the built-ins it registers, the reference (``reference``) and
gefen-x (``gefenx``).
"""
