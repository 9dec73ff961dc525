package store

// Translate exposes translate to the external tests, which cannot live in
// package store (they import pgtest, which imports store).
var Translate = translate
