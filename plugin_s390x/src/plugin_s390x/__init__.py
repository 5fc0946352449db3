"""Backend plugin for IBM Z (s390x) CPUs with vector extensions. Cheap to import: no torch here."""

import plugins


@plugins.hookimpl
def register_platform():
    from plugin_s390x.platform import S390xPlatform

    return S390xPlatform
