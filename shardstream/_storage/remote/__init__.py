"""Reading remote objects: ranged requests, retries, spans in flight, announcements, buffers."""
