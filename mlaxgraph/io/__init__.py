"""Files: the JSON schema of graphs, the weights file, and save/load of both."""

from .functions import function_name, lookup_function, register_function
from .json_format import graph_from_dict, graph_from_json, graph_to_dict, graph_to_json

__all__ = ["register_function", "function_name", "lookup_function", "graph_to_json",
           "graph_from_json", "graph_to_dict", "graph_from_dict"]
