"""The Identity service: who the plugin is, what it serves, and whether it can serve."""

from __future__ import annotations

import os

from google.protobuf import wrappers_pb2

from casfs import __version__
from casfs.catalog import meta_value
from casfs.csi.codes import Unmet
from casfs.csi.plugin import DRIVER_NAME, Plugin
from casfs.csi.proto import csi_pb2 as pb

Service = pb.PluginCapability.Service
Expansion = pb.PluginCapability.VolumeExpansion


class Identity:
    def __init__(self, plugin: Plugin, controller: bool) -> None:
        self.plugin, self.controller = plugin, controller

    def GetPluginInfo(self, request: pb.GetPluginInfoRequest) -> pb.GetPluginInfoResponse:
        return pb.GetPluginInfoResponse(name=DRIVER_NAME, vendor_version=__version__)

    def GetPluginCapabilities(
        self, request: pb.GetPluginCapabilitiesRequest
    ) -> pb.GetPluginCapabilitiesResponse:
        services = [Service.VOLUME_ACCESSIBILITY_CONSTRAINTS]
        if self.controller:
            services.insert(0, Service.CONTROLLER_SERVICE)
        caps = [pb.PluginCapability(service=Service(type=s)) for s in services]
        # Offline: a block volume is resized at rest (casfs volume resize), not while staged.
        caps.append(pb.PluginCapability(volume_expansion=Expansion(type=Expansion.OFFLINE)))
        return pb.GetPluginCapabilitiesResponse(capabilities=caps)

    def Probe(self, request: pb.ProbeRequest) -> pb.ProbeResponse:
        """Ready when the catalog answers and /dev/fuse opens; otherwise the reason."""
        meta_value(self.plugin.repo.conn, "format_version")  # (the catalog answers, or raises)
        try:
            os.close(os.open("/dev/fuse", os.O_RDWR))
        except OSError as e:
            raise Unmet(f"FUSE is not usable: /dev/fuse: {e.strerror}") from None
        return pb.ProbeResponse(ready=wrappers_pb2.BoolValue(value=True))
