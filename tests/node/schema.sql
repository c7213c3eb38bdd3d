-- The shop's tables as the sidecar's default schema mapping expects them, plus the
-- allocation column (initial_stock) that the oversold probe compares paid units with.
CREATE TABLE products (
    id serial PRIMARY KEY,
    sku text NOT NULL UNIQUE,
    available_stock integer NOT NULL,
    initial_stock integer NOT NULL
);
CREATE TABLE orders (
    id serial PRIMARY KEY,
    status text NOT NULL,
    external_ref text,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE order_items (
    order_id integer NOT NULL REFERENCES orders (id),
    product_id integer NOT NULL REFERENCES products (id),
    quantity integer NOT NULL
);
CREATE INDEX ON orders (created_at);
CREATE INDEX ON order_items (product_id);
