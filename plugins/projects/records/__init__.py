"""Project records: the projects themselves and the people who follow them.

It owns the project rows and their status transitions (``projects``), who may see or act
on a project (``access``), the subscribers of a project's milestones (``subscribers``) and
the notifier actor that tells them through the messenger contract (``notifier``). It
depends on nothing else in the plugin but its tables.
"""
