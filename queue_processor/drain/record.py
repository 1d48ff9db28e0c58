"""What the controller changed on a Node is kept on the Node so it can be undone exactly (DESIGN.md rule 12): the
names of the annotation and label that hold it (:class:`~queue_processor.drain.node_writes.CordonRecord`)."""

#: The Node annotation holding the :class:`~queue_processor.drain.node_writes.CordonRecord` (JSON).
RECORD_ANNOTATION = "queue-processor/cordoned"
#: The Node label (value ``"true"``) on every node that carries a record: what a label selector lists.
RECORD_LABEL = "queue-processor/cordoned"
