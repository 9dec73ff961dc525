package store

// ListQuery exposes the statement ListNodes runs, for plans.
var ListQuery = listQuery
