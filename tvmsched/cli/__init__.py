"""The command line (`tvmsched ...`) and its tools: inspect, compare, conformance, the switch benchmark."""
