"""The web console at ``/ui``: server-rendered pages for reviewers and operators.

Every page is built by calling the API's own handlers (:mod:`api.routes`,
:mod:`api.fleet_routes`) with the grant of the key signed in, so the console sees exactly what
that key sees over HTTP, refusals included. The key is kept in an HttpOnly cookie
(:mod:`api.console.session`); pages are :mod:`api.console.pages`; what they show is shaped by
:mod:`api.console.shown`. Design: ``docs/adr/0130-console.md``.
"""
