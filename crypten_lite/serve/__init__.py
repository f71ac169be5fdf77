"""Private prediction as a service (`crypten-lite serve`), above crypten_lite.nn.

Modules: server (one computing party: model loaded once, lockstep batching loop), batching
(the leader's decisions), wire (validation of a client's shares), store (each party's saved
weight shares), metrics, web (HTTP endpoint and page for browsers), local (the whole service
on one machine). The client is a separate torch-free distribution: client/ in the repository
(`crypten_lite_client`). See docs/serving.md.
"""
