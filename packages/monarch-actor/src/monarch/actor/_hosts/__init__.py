"""The ``_hosts`` layer: OS processes, nodes and hosts; the top layer of ``monarch.actor``.

Its modules may import every other layer. Inside it the order is ``commands < groups <
attach_protocol < attach_session < client_node < spawn < nested < agent < host_mesh < (worker,
attach_daemon < attach_procs, settle)``, except that ``attach_daemon`` imports only
``attach_protocol`` (and ``commands`` through it): a worker loop listens before it imports the
rest, and ``attach_procs`` registers how it starts workers (``set_proc_starter``); ``zygote``,
``worker_exits`` and ``client_attach`` import no other module of the package. What each holds:

- ``commands``: the worker command line, ``BootstrapCommand``, ``proc_bind``, start-up lines,
  the bounds of starting and stopping processes (pure);
- ``groups``: ``WorkerGroup``, ``LocalWorkerGroup``, start-up, process lifecycle records,
  ``OutputForwarder`` (worker output with its rank prefix), the zygote glue; ``zygote``: the
  warm process that forks workers;
- hosts started separately: ``attach_protocol`` (``monarch.host.v1``, sans-IO),
  ``attach_session`` (``HostSession``, ``RemoteWorkerGroup``), ``attach_daemon``
  (``run_worker_loop_forever``, ``python -m monarch.actor._attach``) and ``attach_procs`` (the
  worker processes a daemon starts); ``client_attach``: ``attach(addr)``;
- ``client_node``: ``ClientNodeLayer`` (the client's identity and lazy node);
- ``spawn`` (``start_group``, ``bring_up``, ``ProcSetup``), ``nested`` (``NestedProcs``) and
  ``agent`` (the client's host agent, controllers);
- ``host_mesh``: ``HostMesh``, ``this_host``, ``attach_to_workers``; sets hooks H3
  (``_runtime.client.set_node_layer``) and H4 (``_mesh.meshes.set_host_resolver``);
- ``worker`` (``python -m monarch.actor._worker``) and ``worker_exits`` (its exit watches,
  stdlib only);
- ``settle``: the fault hook, ``shutdown_context``, ``flush_supervision``.
"""
