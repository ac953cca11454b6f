"""Images a request carries: fetched (data: URLs, allowed http(s) hosts), decoded and checked."""
