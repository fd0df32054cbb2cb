"""Search: MetaSchedule tuning, restricted-unit candidates, measurement (here, and in kits run on a device machine)."""
