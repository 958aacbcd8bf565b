"""Workers on a real PostgreSQL: claims, leases, retries, dependencies, limits, schedules, maintenance."""
