"""The load generator, after `vllm bench serve`: a request list sent on its schedule to one server, or
to several in `compare` (which starts and stops the launched ones), each request timed."""
