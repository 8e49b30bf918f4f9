"""The ``_base`` layer: values and declarations; the bottom layer, it imports no other layer.

Modules, each importing only those before it: ``shape`` (``Slice``, ``Shape``, ``Extent``,
``Point``, ``MeshTrait``) < ``value_mesh`` (``ValueMesh``) < ``errors`` (``ActorError``,
``SupervisionError``, ``MeshFailure``, ``FailureEvent``) < ``codec`` (pickle protocol 5 with
out-of-band buffers) < ``envelope`` (``Envelope`` and its sans-IO stream framing) < ``ids``
(``ProcId``, ``ActorId``) < ``uid`` (``Uid``) < ``loop`` (``RuntimeLoop``) < ``future``
(``Future``) < ``endpoint`` (``@endpoint`` declarations) < ``actor`` (the ``Actor`` base class).
"""
