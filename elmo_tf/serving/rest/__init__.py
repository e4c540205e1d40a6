"""TF Serving's REST API (as its model_servers/http_rest_api_handler and util/json_tensor): the HTTP front and
its JSON.

    rest_front.py   the HTTP server (aiohttp): body, in-flight and deadline limits
    rest_api.py     the REST routes (/v1/models/...), transport-free, over the core
    json_tensor.py  JSON request bodies -> tensors as TF Serving reads them (row and columnar formats, its errors)
    rest_json.py    tensors -> JSON: the response written within its limit
    json_examples.py Classify and Regress bodies checked as TF Serving checks them (not run)
"""
