"""vmi-moe's arithmetic written once on lane values, for every kernel that must reproduce it."""
