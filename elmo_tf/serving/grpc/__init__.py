"""TF Serving's gRPC API (as its model_servers/prediction_service_impl and model_service_impl): the front, the
parsing of its requests, and its TLS.

    grpc_front.py  PredictionService and ModelService over the core
    call_places.py the places of the open calls (waiting for their message, at work), bounded per connection and address
    grpc_parse.py  request messages parsed within their size limits, before the core sees them
    tls.py         SslConfig: the server's certificate, key and client CA (TF Serving's --ssl_config_file)
"""
