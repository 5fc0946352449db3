"""Backend plugin running models through the OpenVINO runtime. Cheap to import: no openvino or torch here."""

import plugins


@plugins.hookimpl
def register_platform():
    from plugin_openvino.platform import OpenVinoPlatform

    return OpenVinoPlatform
