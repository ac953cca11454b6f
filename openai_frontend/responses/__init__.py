"""The Responses API: its input items, answer objects, stored responses and their follower."""
