"""What any server could reach on a machine: the bare dense forward, ideal static and continuous
batching, and the machine's decode roofline."""
