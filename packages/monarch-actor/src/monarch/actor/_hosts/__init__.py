"""The ``_hosts`` layer: OS processes, nodes and hosts (the client's node, worker processes and
their groups, attached hosts, the host agent, ``HostMesh``, the worker's entry point).

The top layer of ``monarch.actor``: its modules may import every other layer. Inside it the
order is ``commands < groups < attach_protocol < attach_session < client_node < spawn <
nested < agent < host_mesh < (worker, attach_daemon, settle)``; ``zygote``, ``worker_exits``
and ``client_attach`` import no other module of the package.
"""
