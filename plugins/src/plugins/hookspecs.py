"""Hook specifications of the ``core`` plugin system (pluggy project ``"core"``)."""

import pluggy

PROJECT_NAME = "core"
#: the entry-point group a backend distribution registers its hook module under
ENTRY_POINT_GROUP = "core.platforms"
#: the backends of this project: ``--device <name>`` comes from ``pip install plugin_<name>``
FIRST_PARTY_DEVICES = (
    "apple",
    "cpu_arm",
    "cpu_x86",
    "cuda",
    "hpu",
    "neuron",
    "openvino",
    "rocm",
    "s390x",
    "tpu",
    "xpu",
)

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def register_platform():
    """Return the backend this plugin provides.

    Called once per plugin module when the engine discovers plugins.

    :return: a :class:`plugins.Platform` subclass (or an instance of one). The engine
        instantiates a class with no arguments. Must be cheap and must not touch the
        device: availability is asked later through ``Platform.is_available()``.

    .. versionadded:: 1
    """
