"""Cones of :mod:`dxopt.conic`, one file each (see :mod:`dxopt.conic.cones.base`)."""

from dxopt.conic.cones.base import Cone as Cone

__all__ = ["Cone"]
