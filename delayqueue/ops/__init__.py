"""The operator's UI: the admin's pages (admin/), the topic dashboard, /metrics and the figures they
read. Imports every layer below, the API's validation and wire shapes included."""
