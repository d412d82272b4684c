"""Cost models: topology and links, compute times and sizes."""
from .base import LINK_CLASSES, VALUE_KINDS, CostModel, LinkClass, LinkModel
from .base import Topology as TopologyProtocol
from .topology import LinkSpec, Links, Topology, default_link_specs
from .uniform import UniformCost

__all__ = ["LINK_CLASSES", "VALUE_KINDS", "CostModel", "LinkClass", "LinkModel", "TopologyProtocol",
           "Topology", "LinkSpec", "Links", "default_link_specs", "UniformCost"]
# Analytic transformer cost model (pipert/cost/transformer.py) exports go below this line.
