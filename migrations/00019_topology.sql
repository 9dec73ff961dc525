-- +goose Up
-- A node's topology: the GPU's model and id, the fabric its host is wired
-- into, and its labels (a JSON object of strings in Kubernetes label
-- syntax, keys in any order). The registry writes labels only after
-- registry.Labels has checked them; the database holds the shape.
ALTER TABLE nodes
    ADD COLUMN gpu_model text CONSTRAINT nodes_gpu_model_check CHECK (gpu_model <> '' AND length(gpu_model) <= 100),
    ADD COLUMN gpu_uuid  text CONSTRAINT nodes_gpu_uuid_check CHECK (gpu_uuid <> '' AND length(gpu_uuid) <= 100),
    ADD COLUMN fabric    text CONSTRAINT nodes_fabric_check CHECK (fabric <> '' AND length(fabric) <= 200),
    ADD COLUMN labels    jsonb NOT NULL DEFAULT '{}' CONSTRAINT nodes_labels_check CHECK (jsonb_typeof(labels) = 'object');

-- +goose Down
ALTER TABLE nodes DROP COLUMN gpu_model, DROP COLUMN gpu_uuid, DROP COLUMN fabric, DROP COLUMN labels;
