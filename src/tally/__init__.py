"""tally-reconciler: transactional counters in DynamoDB and a stream reconciler for them."""
